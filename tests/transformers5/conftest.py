"""tests/transformers5: what only transformers 5 builds (NeMo RL's containers ship 5.x; .venv
keeps 4.x for megatron-bridge 0.3). They run in .venv-vllm (transformers 5.19), beside
tests/vllm; elsewhere they skip, and under CI (HPCRL_REQUIRE_VLLM=1 or CI) fail instead."""

import os
from importlib.metadata import version

import pytest

from tests.require import VLLM_HINT, unavailable

# Nothing comes from a model hub: the tiny models are built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _needs_transformers_5() -> None:
    found = version("transformers")
    if int(found.split(".")[0]) < 5:
        unavailable(
            "vllm", f"these tests need transformers >= 5, this Python has {found}; {VLLM_HINT}"
        )
