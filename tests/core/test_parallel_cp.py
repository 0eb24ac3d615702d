"""Context parallelism on the real Automodel worker path (the policy the GRPO driver uses):
CP 2 over 2 Ray workers (gloo), with activation checkpointing (its recompute runs the K/V
all-gather again), matches one process: losses, gradient norms, updated weights, per-token
log-probs. The pieces and their mutations: tests/core/test_context_parallel.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.core.parallel_harness import (
    full_weights,
    make_batch,
    masked_nll_loss,
    reference_logprobs,
    reference_training_with_norms,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe, with_automodel

pytestmark = pytest.mark.slow


def cp_widths(backend: object) -> None:
    """From now on, the sequence width each decoder block runs on this rank."""
    layer = backend.model.hf.model.layers[0]
    backend.seen_widths = []
    layer.register_forward_hook(
        lambda _module, inputs, _output: backend.seen_widths.append(inputs[0].shape[1])
    )


def seen_widths(backend: object) -> set[int]:
    return set(backend.seen_widths)


def test_cp2_training_and_logprobs_match_single_process(ray_cluster, tiny_model_path):
    recipe = with_automodel(
        tiny_automodel_recipe(activation_checkpointing=True), context_parallel_size=2
    )
    # 15 positions: padded to 16 (a multiple of 2 x CP), 8 per rank.
    batches = [make_batch(seed, seq_len=15) for seed in range(3)]
    probe = make_batch(seed=11, batch_size=7, seq_len=15)
    policy = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        places = policy.group.places
        policy.group.call_same("run", cp_widths)
        metrics = [policy.train(batch, masked_nll_loss) for batch in batches]
        widths = policy.group.call_same("run", seen_widths)
        weights = policy.group.call_same("run", full_weights)[0]
        got_current = policy.get_logprobs(probe)
        got_initial = policy.get_reference_logprobs(probe)
    finally:
        policy.shutdown()
    ref_losses, ref_norms, ref_weights = reference_training_with_norms(
        tiny_model_path, recipe, batches
    )

    # One data-parallel rank: both CP ranks see the same rows, CP rank 0 returns results.
    assert [(p.dp_rank, p.dp_size, p.returns_results) for p in places] == [
        (0, 1, True),
        (0, 1, False),
    ]
    # Each rank runs half of every padded row: at most 8 of 16 (micro-batches trimmed to
    # their longest row are narrower).
    assert widths[0] == widths[1]
    assert max(widths[0]) == 8
    assert [m["loss"] for m in metrics] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert [m["grad_norm"] for m in metrics] == pytest.approx(ref_norms, rel=1e-4)
    assert [m["num_tokens"] for m in metrics] == [float(b["token_mask"].sum()) for b in batches]
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)

    trained = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    trained.load_state_dict(weights)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    mask = probe["attention_mask"].bool()
    with torch.no_grad():
        for got, model in ((got_current, trained), (got_initial, initial)):
            assert got.shape == probe["input_ids"].shape
            want = reference_logprobs(model, probe)
            torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


def test_cp2_fsdp2_training_matches_single_process(ray_cluster, tiny_model_path):
    """Mesh (dp_shard 2, cp 2): FSDP shards over all 4 ranks, each data-parallel rank's CP
    pair splits its rows; the gradients average as without CP."""
    recipe = with_automodel(tiny_automodel_recipe(), context_parallel_size=2)
    batches = [make_batch(seed, seq_len=15) for seed in range(2)]
    policy = start_policy(recipe, tiny_model_path, world_size=4)
    try:
        places = policy.group.places
        metrics = [policy.train(batch, masked_nll_loss) for batch in batches]
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    ref_losses, ref_norms, ref_weights = reference_training_with_norms(
        tiny_model_path, recipe, batches
    )

    assert [(p.dp_rank, p.dp_size, p.returns_results) for p in places] == [
        (0, 2, True),
        (0, 2, False),
        (1, 2, True),
        (1, 2, False),
    ]
    assert [m["loss"] for m in metrics] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert [m["grad_norm"] for m in metrics] == pytest.approx(ref_norms, rel=1e-4)
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)
