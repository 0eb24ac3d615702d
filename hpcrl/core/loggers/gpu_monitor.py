"""GPU utilisation and memory of every node of the job, sampled while it trains.

One small Ray actor per node that has GPUs (no CPU or GPU reserved) reads NVML
(``nvidia-ml-py``) when asked; a thread in the driver asks every
``logger.gpu_monitoring.collection_interval`` seconds, appends each sample to
``<log_dir>/gpu_metrics.jsonl`` and, every ``flush_interval`` seconds, logs the mean of the
samples since the last flush to the enabled loggers (``gpu/node<i>.gpu<j>.util_pct`` and
``.mem_used_gb``) at the latest training step. A job without GPUs says so once and starts
nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcrl.config.recipe import GpuMonitoringCfg

BYTES_PER_GB = 2**30
Sampler = Callable[[], dict[str, float]]


def read_nvml() -> dict[str, float]:
    """``gpu<j>.util_pct`` and ``gpu<j>.mem_used_gb`` of every GPU this process can see."""
    import pynvml

    pynvml.nvmlInit()
    try:
        values = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            values[f"gpu{index}.util_pct"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
            values[f"gpu{index}.mem_used_gb"] = used / BYTES_PER_GB
        return values
    finally:
        pynvml.nvmlShutdown()


class GpuMonitor:
    """Samples ``samplers`` (node name -> sampler) on a thread; see the module docstring."""

    def __init__(
        self,
        cfg: GpuMonitoringCfg,
        samplers: Mapping[str, Sampler],
        loggers: list[Any],
        out_path: Path,
    ) -> None:
        self.cfg = cfg
        self.samplers = dict(samplers)
        self.loggers = loggers
        self.out_path = out_path
        self.last_step = 0
        self._pending: dict[str, list[float]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)

    def start(self) -> GpuMonitor:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(self.cfg.collection_interval, 1.0) + 30)
        self.flush()

    def _run(self) -> None:
        next_flush = time.monotonic() + self.cfg.flush_interval
        while not self._stop.is_set():
            self.collect()
            if time.monotonic() >= next_flush:
                self.flush()
                next_flush = time.monotonic() + self.cfg.flush_interval
            self._stop.wait(self.cfg.collection_interval)

    def collect(self) -> None:
        sample_time = time.time()
        with open(self.out_path, "a", encoding="utf-8") as handle:
            for node, sampler in self.samplers.items():
                try:
                    values = sampler()
                except Exception as error:  # a node going away must not stop training
                    values = {}
                    print(f"gpu monitor: {node}: {error}", flush=True)
                for key, value in values.items():
                    self._pending[f"gpu/{node}.{key}"].append(value)
                handle.write(json.dumps({"time": sample_time, "node": node, **values}) + "\n")

    def flush(self) -> None:
        pending, self._pending = self._pending, defaultdict(list)
        means = {key: sum(values) / len(values) for key, values in pending.items() if values}
        if means:
            for logger in self.loggers:
                logger.log(self.last_step, means)


def ray_node_samplers() -> dict[str, Sampler]:
    """One NVML-reading actor per Ray node that has GPUs, keyed ``node<i>``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote_reader = ray.remote(num_cpus=0)(_NvmlReader)
    nodes = [node for node in ray.nodes() if node.get("Alive") and node["Resources"].get("GPU")]
    samplers = {}
    for index, node in enumerate(sorted(nodes, key=lambda node: node["NodeManagerAddress"])):
        strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        actor = remote_reader.options(scheduling_strategy=strategy).remote()
        samplers[f"node{index}"] = _actor_sampler(actor)
    return samplers


class _NvmlReader:
    def read(self) -> dict[str, float]:
        return read_nvml()


def _actor_sampler(actor: Any) -> Sampler:
    def sample() -> dict[str, float]:
        import ray

        return ray.get(actor.read.remote(), timeout=30)

    return sample


def start_gpu_monitor(
    cfg: GpuMonitoringCfg,
    loggers: list[Any],
    log_dir: Path,
    samplers: Mapping[str, Sampler] | None = None,
) -> GpuMonitor | None:
    """Start monitoring (samplers default to one per Ray node with GPUs); None without GPUs."""
    samplers = ray_node_samplers() if samplers is None else samplers
    if not samplers:
        print("logger.monitor_gpus: this job has no GPUs; nothing to monitor", flush=True)
        return None
    return GpuMonitor(cfg, samplers, loggers, log_dir / "gpu_metrics.jsonl").start()
