"""Tensor parallelism (2 Ray workers, tp=2) with activation checkpointing matches one process."""

from __future__ import annotations

import pytest
import torch

from tests.core.parallel_harness import (
    full_weights,
    make_batch,
    masked_nll_loss,
    reference_training,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe

pytestmark = pytest.mark.slow


def local_q_proj_shape(backend: object) -> tuple[int, ...]:
    layer = backend.model.hf.model.layers[0]
    inner = getattr(layer, "_checkpoint_wrapped_module", layer)
    return tuple(inner.self_attn.q_proj.weight.to_local().shape)


def test_tp_with_activation_checkpointing_matches_single_process(ray_cluster, tiny_model_path):
    recipe = tiny_automodel_recipe(tp=2, activation_checkpointing=True)
    batches = [make_batch(seed) for seed in range(4)]
    policy = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        places = policy.group.places
        q_shapes = policy.group.call_same("run", local_q_proj_shape)
        metrics = [policy.train(batch, masked_nll_loss) for batch in batches]
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    ref_losses, ref_weights = reference_training(tiny_model_path, recipe, batches)

    # One data-parallel shard; only tp rank 0 returns results; each rank holds half of q_proj.
    assert [(p.dp_rank, p.dp_size, p.returns_results) for p in places] == [
        (0, 1, True),
        (0, 1, False),
    ]
    assert q_shapes == [(32, 64), (32, 64)]
    assert [m["loss"] for m in metrics] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)
