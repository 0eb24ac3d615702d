"""Automodel layouts beyond one dimension: the 2-D mesh (TP 2 × FSDP 2 on 4 Ray workers)
matches the single-process reference loop, and a checkpoint written by one layout resumes in
another (saved by FSDP over 2 workers, loaded by FSDP over 4 and by TP 2) exactly as the saving
run continued."""

from __future__ import annotations

import attrs
import pytest
import torch

from hpcrl.config.recipe import LrSchedulerCfg
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
    return tuple(layer.self_attn.q_proj.weight.to_local().shape)


def test_tp2_fsdp2_mesh_matches_single_process(ray_cluster, tiny_model_path):
    recipe = tiny_automodel_recipe(tp=2)
    batches = [make_batch(seed) for seed in range(3)]
    policy = start_policy(recipe, tiny_model_path, world_size=4)
    try:
        places = policy.group.places
        q_shapes = policy.group.call_same("run", local_q_proj_shape)
        losses = [policy.train(batch, masked_nll_loss)["loss"] for batch in batches]
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    ref_losses, ref_weights = reference_training(tiny_model_path, recipe, batches)

    # Mesh (dp_shard 2, tp 2): two data-parallel shards, tp rank 0 of each returns results.
    assert [(p.dp_rank, p.dp_size, p.returns_results) for p in places] == [
        (0, 2, True),
        (0, 2, False),
        (1, 2, True),
        (1, 2, False),
    ]
    # q_proj (64 × 64): rows split by TP, then again by FSDP: each rank holds a quarter.
    assert q_shapes == [(16, 64)] * 4
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)


def scheduled(recipe):
    # Linear warm-up over 2 steps, then cosine to a tenth over the remaining 6 (NeMo RL's form).
    lr = recipe.policy.optimizer.kwargs["lr"]
    scheduler = (
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.LinearLR",
            kwargs={"start_factor": 0.5, "end_factor": 1.0, "total_iters": 2},
        ),
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.CosineAnnealingLR",
            kwargs={"T_max": 6, "eta_min": 0.1 * lr},
        ),
        LrSchedulerCfg(milestones=(2,)),
    )
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, scheduler=scheduler))


def train_steps(policy, batches) -> list[dict]:
    return [policy.train(batch, masked_nll_loss) for batch in batches]


@pytest.fixture(scope="module")
def saved_at_fsdp2(ray_cluster, tiny_model_path, tmp_path_factory):
    """3 steps on FSDP over 2 workers, a checkpoint, then the 2 steps the saving run went on
    with (metrics and final weights): what every resumed layout must reproduce."""
    batches = [make_batch(seed) for seed in range(5)]
    checkpoint_dir = str(tmp_path_factory.mktemp("layouts") / "step_3")
    policy = start_policy(scheduled(tiny_automodel_recipe()), tiny_model_path, world_size=2)
    try:
        train_steps(policy, batches[:3])
        policy.save_checkpoint(checkpoint_dir, {"step": 3})
        continued = train_steps(policy, batches[3:])
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    return checkpoint_dir, batches[3:], continued, weights


@pytest.mark.parametrize(
    ("world_size", "tp"), [pytest.param(4, 1, id="fsdp4"), pytest.param(2, 2, id="tp2")]
)
def test_checkpoint_resumes_in_another_layout(saved_at_fsdp2, tiny_model_path, world_size, tp):
    checkpoint_dir, batches, continued, continued_weights = saved_at_fsdp2
    policy = start_policy(
        scheduled(tiny_automodel_recipe(tp=tp)), tiny_model_path, world_size=world_size
    )
    try:
        assert policy.load_checkpoint(checkpoint_dir) == {"step": 3}
        steps_after_load = [state["step"] for state in policy.collect_state()]
        resumed = train_steps(policy, batches)
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()

    assert steps_after_load == [3] * world_size
    assert [m["lr"] for m in resumed] == pytest.approx([m["lr"] for m in continued], rel=1e-12)
    for got, want in zip(resumed, continued, strict=True):  # sums in another order: not bitwise
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    for name, want in continued_weights.items():
        torch.testing.assert_close(weights[name], want, atol=1e-5, rtol=0, msg=name)
