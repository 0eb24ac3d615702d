"""megatron-bridge's own HF → Megatron load at TP=2 (2 gloo ranks) on locally built tiny Llama
and Qwen2: logits equal HF's within 1e-5 and the weights exported back are bit-identical —
with the ``bridge_contiguous_scatter`` patch where the bridge needs it (0.3.x). Without it the
same 0.3.x load silently gives wrong row-parallel weights: that test fails the day the patch
stops being needed (or the bug moves), so the patch cannot go stale unnoticed; on 0.6.x the
same test asserts the load is right without the patch."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.megatron import harness
from tests.megatron.bridge_tp_load import load_through_bridge
from tests.megatron.tiny_hf import build_tiny_hf_model

# Spawns 2 gloo ranks that import megatron-bridge and build models: ~1 min on 2 cores.
pytestmark = pytest.mark.slow

TP = 2


def _weights(folder) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _hf_logits(hf_path: str, input_ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits.float()


def _load_at_tp2(tmp_path, model_type: str, skip_patches=frozenset()):
    hf_dir = build_tiny_hf_model(tmp_path / "hf", model_type)
    input_ids = harness.fixed_batch()["input_ids"]
    export_dir = tmp_path / "exported"
    results = harness.run_ranks(
        TP,
        load_through_bridge,
        str(hf_dir),
        input_ids,
        str(export_dir),
        skip_patches=skip_patches,
    )
    return hf_dir, input_ids, results[0], export_dir


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_bridge_tp2_load_matches_hf(tmp_path, model_type):
    hf_dir, input_ids, logits, export_dir = _load_at_tp2(tmp_path, model_type)

    expected = _hf_logits(str(hf_dir), input_ids)
    assert logits.shape == expected.shape
    assert (logits - expected).abs().max().item() < 1e-5

    original, exported = _weights(hf_dir), _weights(export_dir)
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def test_without_the_patch_tp2_weights_are_silently_wrong_on_bridge_0_3(tmp_path):
    from hpcrl.core.backends.megatron.cpu_compat import bridge_needs_contiguous_scatter

    hf_dir, _, _, export_dir = _load_at_tp2(
        tmp_path, "llama", skip_patches=frozenset({"bridge_contiguous_scatter"})
    )
    original, exported = _weights(hf_dir), _weights(export_dir)
    wrong = sorted(
        name for name, tensor in original.items() if not torch.equal(exported[name], tensor)
    )
    # 0.3.x: exactly the weights split along dim 1 (row-parallel) come back wrong; everything
    # else (column-parallel, replicated) is right. If this fails with `wrong == []`, gloo's
    # scatter now handles non-contiguous views (or the bridge copies): drop the patch.
    # 0.6.x copies the pieces contiguous itself: nothing is wrong without the patch.
    expected = []
    if bridge_needs_contiguous_scatter():
        expected = sorted(
            f"model.layers.{layer}.{name}.weight"
            for layer in range(2)
            for name in ("self_attn.o_proj", "mlp.down_proj")
        )
    assert wrong == expected
