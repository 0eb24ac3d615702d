"""``optimizer_offload_fraction`` through the real Automodel worker: FSDP2 over 2 Ray workers
(gloo, CPU), the host-side state sharded as DTensors like the parameters. Training matches a
single process with plain AdamW, and a checkpoint saved at fraction 0.5 resumes at fraction
1.0 with the same losses and weights as the run that went on. On CPU the "host" step stages
copies of CPU tensors: the device-to-host traffic itself is the H200's to show
(docs/performance.md, "8B on one H200")."""

from __future__ import annotations

import attrs
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

pytestmark = pytest.mark.slow  # two 2-worker Ray groups (~1 min here)


def offloading_recipe(fraction: float):
    recipe = tiny_automodel_recipe()
    cfg = attrs.evolve(recipe.policy.automodel_cfg, optimizer_offload_fraction=fraction)
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=cfg))


def _host_state_devices(backend) -> list[str]:
    optimizer = backend.optimizer
    return sorted(
        {
            str(optimizer.state[p]["exp_avg"].to_local().device)
            + (" host" if optimizer.is_on_host(p) else " device")
            for p in optimizer.state
        }
    )


def test_fsdp_with_half_the_state_offloaded_trains_and_resumes_at_another_fraction(
    ray_cluster, tiny_model_path, tmp_path
):
    batches = [make_batch(seed) for seed in range(5)]
    checkpoint_dir = str(tmp_path / "step_3")
    first = start_policy(offloading_recipe(0.5), tiny_model_path, world_size=2)
    try:
        trained = [first.train(batch, masked_nll_loss) for batch in batches[:3]]
        placements = first.group.call_same("run", _host_state_devices)[0]
        first.save_checkpoint(checkpoint_dir, {"step": 3})
        continued = [first.train(batch, masked_nll_loss) for batch in batches[3:]]
        continued_weights = first.group.call_same("run", full_weights)[0]
    finally:
        first.shutdown()
    assert placements == ["cpu device", "cpu host"]  # both kinds of parameter present

    ref_losses, _ = reference_training(
        tiny_model_path, tiny_automodel_recipe(), batches[:3] + batches[3:]
    )
    losses = [m["loss"] for m in trained + continued]
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)

    resumed = start_policy(offloading_recipe(1.0), tiny_model_path, world_size=2)
    try:
        resumed.load_checkpoint(checkpoint_dir)
        after = [resumed.train(batch, masked_nll_loss) for batch in batches[3:]]
        resumed_weights = resumed.group.call_same("run", full_weights)[0]
    finally:
        resumed.shutdown()
    for got, want in zip(after, continued, strict=True):
        assert abs(got["loss"] - want["loss"]) <= 1e-6
    for name, want in continued_weights.items():
        torch.testing.assert_close(resumed_weights[name], want, atol=1e-6, rtol=0, msg=name)
