"""Placement across nodes: a real two-node Ray cluster on this machine (``ray.cluster_utils``
starts a second raylet); rank r must land on node r // workers_per_node, node 0 being the
driver's, and the ranks must form one gloo group across the nodes that trains correctly.
Then faults: a rank that raises, or whose process dies, is named (``WorkerFailed``) at once,
while the other rank is still busy, and the group still shuts down."""

from __future__ import annotations

import os
import time

import pytest

from tests.core.parallel_harness import (
    DiagnosticWorker,
    make_batch,
    masked_nll_loss,
    reference_training,
)
from tests.recipe_builder import tiny_automodel_recipe

pytestmark = pytest.mark.slow


def node_of_rank(backend: object) -> tuple[int, str]:
    import ray
    import torch.distributed as dist

    return dist.get_rank(), ray.get_runtime_context().get_node_id()


FAILURE = "bad shard on rank 1"


def raise_on_rank_1(backend: object, release: str) -> int:
    """Rank 1 raises; rank 0 stays busy until ``release`` exists (as in a collective)."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError(FAILURE)
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


def exit_on_rank_1(backend: object) -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(1)  # the process ends as a killed one would: no exception, no result
    return 0


def assert_failures_name_the_rank(policy, release) -> None:
    from hpcrl.core.workers.failures import WorkerFailed

    started = time.monotonic()
    with pytest.raises(WorkerFailed) as raised:
        policy.group.call_same("run", raise_on_rank_1, str(release))
    waited_s = time.monotonic() - started
    release.touch()
    rank_1_ip = policy.group.rank_node_ips[1]
    assert waited_s < 60, "rank 0's unfinished call held the failure back"
    assert str(raised.value) == f"worker rank 1 ({rank_1_ip}) raised ValueError: {FAILURE} in run"
    assert (raised.value.rank, raised.value.died, raised.value.error_type) == (
        1,
        False,
        "ValueError",
    )
    with pytest.raises(WorkerFailed) as died:
        policy.group.call_same("run", exit_on_rank_1)
    assert str(died.value) == (
        f"worker rank 1 ({rank_1_ip}) died (its process exited unexpectedly: killed, or out of "
        "memory?) in run"
    )
    assert policy.group.failed  # shutdown kills the workers without asking them to close


def test_ranks_land_on_their_nodes_and_train_together(two_node_cluster, tiny_model_path, tmp_path):
    import ray

    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.workers.group import GroupLayout
    from hpcrl.core.workers.ray_policy import RayPolicy

    recipe = tiny_automodel_recipe()
    batches = [make_batch(seed) for seed in range(2)]
    messages: list[str] = []
    layout = GroupLayout(num_nodes=2, workers_per_node=1, device="cpu")
    policy = RayPolicy(
        recipe,
        tiny_model_path,
        layout,
        worker_class_path("automodel"),
        progress=messages.append,
        actor_class=DiagnosticWorker,
    )
    try:
        placed = policy.group.call_same("run", node_of_rank)
        losses = [policy.train(batch, masked_nll_loss)["loss"] for batch in batches]
        assert_failures_name_the_rank(policy, tmp_path / "release")
    finally:
        shutdown_started = time.monotonic()
        policy.shutdown()
    assert time.monotonic() - shutdown_started < 30
    ref_losses, _ = reference_training(tiny_model_path, recipe, batches)

    driver_node = ray.get_runtime_context().get_node_id()
    all_nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert placed[0] == (0, driver_node)
    assert placed[1][0] == 1 and placed[1][1] in all_nodes - {driver_node}
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert messages[0].startswith("placing 2 workers (1 per node on 2 nodes")
    assert messages[-1].startswith("2 workers ready in")
