"""MoE experts in the checkpoint's per-expert layout under transformers 4 and 5
(``hpcrl.core.backends.automodel.expert_layout``).

CI runs this module in both test environments: .venv (transformers 4, per-expert modules
already) and .venv-vllm (transformers 5, which fuses experts into 3-D weights on load).
Under both, a tiny MoE checkpoint loaded as the backend loads it:
- gives the same logits as transformers' own model of the checkpoint,
- has a state dict with exactly the checkpoint's names and tensors (what refits hand vLLM
  and what hpcrl's checkpoints hold), for the families it unfuses (Qwen3-MoE, Mixtral) and,
  through ``checkpoint_named_tensors``, for one it leaves fused (Qwen2-MoE).
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import torch

COMMON = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2,
    max_position_embeddings=64, tie_word_embeddings=False,
)  # fmt: skip
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=16, head_dim=8, norm_topk_prob=True),
    "mixtral": dict(num_local_experts=4, head_dim=8),
    "qwen2_moe": dict(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=16),
}


TRANSFORMERS_MAJOR = int(version("transformers").split(".")[0])


def build(folder: Path, model_type: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**COMMON, **SHAPES[model_type]})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return str(folder)


def checkpoint_file(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


@pytest.mark.parametrize("model_type", list(SHAPES))
def test_backend_model_has_the_checkpoint_layout_and_the_same_logits(tmp_path, model_type):
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.expert_layout import checkpoint_named_tensors
    from hpcrl.core.backends.automodel.model import load_hf_model

    path = build(tmp_path / model_type, model_type)
    backend = load_hf_model(path, "cpu").eval()
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = backend(input_ids=ids).logits
        want = reference(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    named = checkpoint_named_tensors(backend, list(backend.state_dict().items()))
    on_disk = checkpoint_file(path)
    assert sorted(name for name, _ in named) == sorted(on_disk)
    for name, tensor in named:
        assert torch.equal(tensor, on_disk[name]), name


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_unfused_experts_get_the_fused_gradients(tmp_path, model_type):
    """The per-expert modules train as transformers' own model of the checkpoint: the same
    loss gradient for every expert weight a token reaches (in checkpoint names)."""
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.expert_layout import (
        checkpoint_named_tensors,
        unfuse_experts,
    )

    path = build(tmp_path / model_type, model_type)
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(2))
    grads = []
    for unfuse in (False, True):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if unfuse:
            # transformers 5 fuses these experts on load; transformers 4 does not
            assert unfuse_experts(model) == (2 if TRANSFORMERS_MAJOR >= 5 else 0)
        model(input_ids=ids, labels=ids).loss.backward()
        named = [(n, p.grad if p.grad is not None else torch.zeros_like(p))
                 for n, p in model.named_parameters()]  # fmt: skip
        grads.append(dict(checkpoint_named_tensors(model, named)))
    fused, unfused = grads
    assert sorted(fused) == sorted(unfused)
    reached = 0
    for name, grad in unfused.items():
        torch.testing.assert_close(grad, fused[name], atol=1e-6, rtol=1e-5, msg=name)
        reached += ".experts." in name and bool(grad.abs().sum() > 0)
    assert reached > 0
