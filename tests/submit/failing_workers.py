"""A training-worker stand-in whose rank 1 raises, and the driver that runs it on the job's
nodes (``HPCRL_DRIVER=tests.submit.failing_workers:worker_raises``).

Test stand-in for a real training step that fails on one rank: hpcrl's own
``RayWorkerGroup`` places one ``TrainingWorker`` per node, but ``setup`` builds no model
and no process group (that would take a minute on this machine and is not what is tested),
and ``step`` raises ``ValueError`` on rank 1 while rank 0 blocks, as a rank waiting in a
collective for its failed peer would.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hpcrl.core.backends.base import DataParallelPlace, RankInfo
from hpcrl.core.workers.actor import TrainingWorker
from hpcrl.core.workers.group import GroupLayout, RayWorkerGroup

FAILURE = "bad batch on rank 1"
BLOCKED_S = 600.0  # rank 0's step: far longer than the test allows the job


class FailingWorker(TrainingWorker):
    def setup(self, recipe: Any, rank_info: RankInfo, model_path: str, num_threads: int):
        self._rank = rank_info.rank
        return DataParallelPlace(
            dp_rank=rank_info.rank, dp_size=rank_info.world_size, returns_results=True
        )

    def step(self) -> int:
        if self._rank == 1:
            raise ValueError(FAILURE)
        time.sleep(BLOCKED_S)
        return self._rank


def worker_raises(run_dir: str) -> int:
    """One worker per node; their first ``step`` fails on rank 1 (the driver raises)."""
    num_nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    layout = GroupLayout(num_nodes=num_nodes, workers_per_node=1, device="cpu")
    group = RayWorkerGroup(layout, "tests.submit.failing_workers:unused", actor_class=FailingWorker)
    try:
        group.start(recipe=None, model_path="(no model)", timeout_s=120)
        Path(run_dir, "workers_started").write_text(" ".join(group.rank_node_ips))
        group.call_all("step")
    finally:
        group.shutdown()
    return 0
