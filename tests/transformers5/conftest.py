"""tests/transformers5 run in .venv-vllm, whose transformers is 5.x (.venv's megatron-bridge
pins transformers < 5): the decoders only transformers 5 builds
(``TRANSFORMERS5_MODEL_TYPES`` in hpcrl.config.architectures). Elsewhere they skip; under CI
(HPCRL_REQUIRE_VLLM=1, set by .ci/test's command for tests/vllm and this folder, or CI) an
older transformers fails them instead."""

import os

import pytest

from tests.require import VLLM_HINT, unavailable

# Nothing comes from a model hub: the tiny models are built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _needs_transformers5() -> None:
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        unavailable(
            "vllm", f"transformers {transformers.__version__} here, these need >= 5; {VLLM_HINT}"
        )
