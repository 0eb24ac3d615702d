"""The Automodel reference model built from the policy's weights in memory (before the first
train step) instead of from the checkpoint: the same log-probs as the checkpoint build,
exactly, on 1 gloo rank and under FSDP2 and TP on 2 (the real worker, spawned processes); copies, not
aliases (the policy trains, the reference does not move); a resumed policy and LoRA keep
loading the checkpoint. The compiled case: tests/core/test_no_recompile.py."""

from __future__ import annotations

import pytest
import torch

from hpcrl.core.models.tiny import ensure_tiny_model
from tests.core import reference_ranks
from tests.megatron.harness import run_ranks

pytestmark = pytest.mark.slow  # two spawned ranks, several worker setups each


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path_factory.mktemp("models")))


@pytest.mark.parametrize(("ranks", "tp"), [(1, 1), (2, 1), (2, 2)], ids=["1rank", "fsdp2", "tp2"])
def test_reference_from_policy_equals_checkpoint_build(model_path, tmp_path, ranks, tp) -> None:
    results = run_ranks(
        ranks, reference_ranks.reference_paths, model_path, str(tmp_path), tp, megatron=False
    )
    for result in results:
        assert result["source"] == "policy"
        assert result["aliased"] == []
        # same module init, same sharding, the same fp32 values copied: bit-equal
        assert torch.equal(result["from_policy"], result["from_checkpoint"])
        assert torch.equal(result["from_policy"], result["initial_policy"])
        moved = (result["trained_policy"] - result["initial_policy"]).abs().max()
        assert moved > 1e-3, "the policy trained"
        assert torch.equal(result["reference_after"], result["from_policy"])
        # a resumed policy no longer holds the initial weights: the checkpoint is read
        assert result["resumed_source"] == "checkpoint"
        assert torch.equal(result["resumed_reference"], result["from_checkpoint"])
        if tp == 1:
            assert result["lora_source"] == "checkpoint"
            assert torch.equal(result["lora_reference"], result["from_checkpoint"])


def test_parameters_move_uninitialised_with_ties_kept(tmp_path) -> None:
    """The GPU path of ``unloaded_hf_model`` (parameters made on the device, not copied from
    never-written host pages), here onto the meta device: tied embeddings stay one
    parameter, requires_grad stays, buffers (rotary inv_freq) stay as module init made them."""
    from hpcrl.core.backends.automodel.logprobs import parameters_on, unloaded_hf_model

    path = ensure_tiny_model("tiny:qwen3", cache_dir=str(tmp_path))
    model = unloaded_hf_model(path, "cpu")
    model.model.embed_tokens.weight.requires_grad_(False)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    count = len(list(model.parameters()))
    parameters_on(model, torch.device("meta"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len(list(model.parameters())) == count
    assert all(p.device.type == "meta" for p in model.parameters())
    assert not model.model.embed_tokens.weight.requires_grad
    assert all(p.requires_grad for n, p in model.named_parameters() if "embed" not in n)
    assert buffers and all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())


@pytest.mark.parametrize(("ranks", "tp"), [(1, 1), (2, 2)], ids=["1rank", "tp2"])
def test_host_resident_reference_gives_the_same_logprobs(model_path, tmp_path, ranks, tp) -> None:
    """``policy.automodel_cfg.reference_on_host``: the reference behind FSDP2's CPU offload,
    every block resharded after its forward and the root after the pass, built from the
    policy's weights (one rank: the plain policy's tensors copied into the FSDP shards) or
    from the checkpoint (resumed), gives the default reference's log-probs bit for bit. What
    differs on a GPU (the shards page-locked on the host, one copy in per block) runs in
    tests/gpu/test_gpu_jobs.py."""
    results = run_ranks(
        ranks, reference_ranks.host_reference_paths, model_path, str(tmp_path), tp, megatron=False
    )
    for result in results:
        assert result["source"] == "policy"
        assert result["resumed_source"] == "checkpoint"
        for state in (result["state"], result["resumed_state"]):
            assert state["fsdp_params"] > 0
            assert state["offloaded"] == state["fsdp_params"]
            assert state["gathered"] == 0
        assert torch.equal(result["host"], result["from_checkpoint"])
        assert torch.equal(result["host_after"], result["from_checkpoint"])
        assert torch.equal(result["resumed"], result["from_checkpoint"])


def test_a_bf16_host_reference_takes_the_policys_weights_rounded(tmp_path) -> None:
    """On a GPU the host-resident reference stores its parameters in the compute dtype
    (``apply_storage_dtype``; CPU runs keep fp32, above): buffers stay fp32, ties stay, and
    the fp32 policy's weights copy in rounded, not refused for their dtype."""
    from hpcrl.core.backends.automodel.logprobs import copy_policy_state, unloaded_hf_model
    from hpcrl.core.backends.automodel.model import load_hf_model
    from hpcrl.core.backends.automodel.parallelize import apply_storage_dtype

    path = ensure_tiny_model("tiny:qwen3", cache_dir=str(tmp_path))
    policy = load_hf_model(path, "cpu")
    reference = unloaded_hf_model(path, "cpu")
    apply_storage_dtype(reference, torch.bfloat16)
    assert reference.lm_head.weight is reference.model.embed_tokens.weight
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in reference.buffers()} == {torch.float32}
    assert copy_policy_state(reference, policy)
    for (name, got), want in zip(reference.named_parameters(), policy.parameters(), strict=True):
        assert torch.equal(got, want.to(torch.bfloat16)), name
