"""Sequence packing through the real worker group: FSDP2 over 2 Ray workers (gloo), the
controller's plan (rows dealt by length, equally many packs per rank), packs materialized in
the actors. Losses, the trained weights and log-probs equal a single process that never
packs (float32: losses within 1e-5 relative, log-probs within 1e-4)."""

from __future__ import annotations

import attrs
import pytest
import torch
from transformers import AutoModelForCausalLM

from hpcrl.config.recipe import SequencePackingCfg
from tests.core.parallel_harness import (
    make_batch,
    masked_nll_loss,
    reference_logprobs,
    reference_training,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe

pytestmark = pytest.mark.slow


def packing_recipe():
    recipe = tiny_automodel_recipe()
    packing = SequencePackingCfg(
        enabled=True, train_mb_tokens=40, logprob_mb_tokens=48, sequence_length_round=8
    )
    policy = attrs.evolve(
        recipe.policy,
        sequence_packing=packing,
        make_sequence_length_divisible_by=2,
        max_total_sequence_length=16,
    )
    return attrs.evolve(recipe, policy=policy)


def test_packed_training_matches_single_unpacked_process(ray_cluster, tiny_model_path):
    recipe = packing_recipe()
    batches = [make_batch(seed) for seed in range(3)]
    policy = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        metrics = [policy.train(batch, masked_nll_loss) for batch in batches]
        logprobs = policy.get_logprobs(batches[0])
        from tests.core.parallel_harness import full_weights

        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    ref_losses, ref_weights = reference_training(tiny_model_path, recipe, batches)
    assert [m["loss"] for m in metrics] == pytest.approx(ref_losses, rel=1e-5)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    model.load_state_dict(ref_weights)
    with torch.no_grad():
        expected = reference_logprobs(model, batches[0])
    mask = batches[0]["attention_mask"].float()
    assert torch.allclose(logprobs * mask, expected * mask, atol=1e-4)
    worst = max(float((weights[k] - ref_weights[k]).abs().max()) for k in ref_weights)
    assert worst < 1e-4, worst
