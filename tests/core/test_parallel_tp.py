"""Tensor parallelism with sequence parallelism (2 Ray workers, tp=2) and activation
checkpointing matches one process. Plain TP (no sequence parallelism) is held to the same
reference in tests/core/test_parallel_layouts.py (TP 2 × FSDP 2, and a checkpoint resumed by
TP 2)."""

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
from tests.recipe_builder import tiny_automodel_recipe, with_automodel

pytestmark = pytest.mark.slow


def _first_block(backend: object) -> torch.nn.Module:
    layer = backend.model.hf.model.layers[0]
    return getattr(layer, "_checkpoint_wrapped_module", layer)


def local_q_proj_shape(backend: object) -> tuple[int, ...]:
    return tuple(_first_block(backend).self_attn.q_proj.weight.to_local().shape)


def record_block_output_widths(backend: object) -> None:
    """From now on, the sequence width of what o_proj and down_proj hand to the residual
    stream on this rank: the whole sequence under plain TP, a slice under sequence
    parallelism."""
    block = _first_block(backend)
    backend.seen_widths = []
    for module in (block.self_attn.o_proj, block.mlp.down_proj):
        module.register_forward_hook(
            lambda _module, _inputs, output: backend.seen_widths.append(output.shape[1])
        )


def seen_widths(backend: object) -> set[int]:
    return set(backend.seen_widths)


def test_tp_sequence_parallel_with_activation_checkpointing_matches_single_process(
    ray_cluster, tiny_model_path
):
    recipe = with_automodel(
        tiny_automodel_recipe(tp=2, activation_checkpointing=True), sequence_parallel=True
    )
    # 15 positions: not a multiple of TP, so the worker pads every micro-batch to 16.
    batches = [make_batch(seed, seq_len=15) for seed in range(4)]
    policy = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        places = policy.group.places
        q_shapes = policy.group.call_same("run", local_q_proj_shape)
        policy.group.call_same("run", record_block_output_widths)
        metrics = [policy.train(batch, masked_nll_loss) for batch in batches]
        widths = policy.group.call_same("run", seen_widths)
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
    # Each rank's residual stream holds half of a micro-batch's positions, padded to an even
    # count: at most 8 of the 15 (plain TP: the whole width, up to 15).
    assert widths[0] == widths[1]
    assert max(widths[0]) == 8
    assert [m["loss"] for m in metrics] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)
