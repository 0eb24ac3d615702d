"""HSDP on a (dp_replicate=2, dp_shard=2) mesh of 4 Ray workers matches one process, and the
two replicas of every shard stay bitwise equal."""

from __future__ import annotations

import pytest
import torch

from tests.core.parallel_harness import (
    full_weights,
    local_shards,
    make_batch,
    masked_nll_loss,
    reference_training,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe

pytestmark = pytest.mark.slow


def test_hsdp_matches_single_process_and_replicas_agree(ray_cluster, tiny_model_path):
    recipe = tiny_automodel_recipe(dp_replicate=2, micro_batch_size=1)
    batches = [make_batch(seed) for seed in range(3)]
    policy = start_policy(recipe, tiny_model_path, world_size=4)
    try:
        assert [p.dp_rank for p in policy.group.places] == [0, 1, 2, 3]
        losses = [policy.train(batch, masked_nll_loss)["loss"] for batch in batches]
        shards = policy.group.call_same("run", local_shards)
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    ref_losses, ref_weights = reference_training(tiny_model_path, recipe, batches)

    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)
    # Ranks r and r + 2 hold the same shard in the two replicas (mesh dim 0 = dp_replicate).
    for rank in (0, 1):
        for name, shard in shards[rank].items():
            assert torch.equal(shard, shards[rank + 2][name]), f"{name} replicas differ"
        assert any(not torch.equal(shards[rank][n], shards[1 - rank][n]) for n in shards[rank]), (
            "the two shards of one replica should hold different parts"
        )
