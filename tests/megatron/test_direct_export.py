"""The Megatron worker's refit without megatron-bridge and its reference pass by swapping.

With the whole model on one rank, ``export_hf_weights`` hands out views of the live
parameters (``direct_export``) instead of the bridge's host copies: the same names and, to
the bit, the same tensors as the bridge exports, before and after training, for Llama and
Qwen2 (q/k/v biases) checkpoints. ``reference_logprobs`` swaps a kept copy of the initial
weights in and out: after training it scores what the untrained model scored, and the current
weights afterwards score exactly as before.
"""

from __future__ import annotations

import pytest
import torch

from tests.megatron import direct_export_ranks, harness

# Spawns a gloo rank that builds a real megatron-core model: about a minute per model.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_direct_export_equals_the_bridge_and_the_reference_swap_restores(
    tmp_path, model_type: str
) -> None:
    hf_path, root = harness.build_converted(tmp_path, model_type)
    (result,) = harness.run_ranks(1, direct_export_ranks.export_and_reference_run, hf_path, root)
    for direct, bridged in result["exports"]:
        assert sorted(direct) == sorted(bridged)
        for name, tensor in bridged.items():
            assert direct[name].shape == tensor.shape, name
            assert torch.equal(direct[name].to(tensor.dtype), tensor), name
    before, after = result["exports"]
    assert any(not torch.equal(before[0][n], after[0][n]) for n in before[0]), "weights moved"
    assert result["worker_export_is_direct"]
    assert not torch.equal(result["trained"], result["initial"])
    assert torch.equal(result["reference"], result["initial"])
    assert torch.equal(result["trained_again"], result["trained"])
    if model_type == "qwen2":
        assert "model.layers.0.self_attn.q_proj.bias" in before[0]
