"""Small drivers for the submission tests, run in the job through ``HPCRL_DRIVER=
tests.submit.drivers:<name>`` (the node entrypoint's documented driver switch).

Test stand-ins for hpcrl's training core: these tests are about submission, job management
and reporting, so the driver only has to produce what the real one leaves behind (metrics
lines, an exit code). Each returns the job's exit code.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

NUM_METRIC_STEPS = 4


def _resolved_recipe(run_dir: str) -> dict:
    import yaml

    return yaml.safe_load(Path(run_dir, "recipe.resolved.yaml").read_text())


def offload_fraction(recipe: dict) -> float:
    return float(recipe["policy"]["megatron_cfg"]["optimizer"]["optimizer_offload_fraction"])


def expected_metrics(fraction: float, step: int) -> dict:
    """What ``write_metrics`` writes for a run with this offload fraction (tests recompute it)."""
    return {
        "step": step,
        "time_step_s": 1.0 + fraction + 0.01 * step,
        "tokens_per_s": 1000.0 / (1.0 + fraction),
        "loss": 1.0 / (step + fraction),
        "reward_mean": fraction * step,
        "peak_gpu_mem_gb": None,
        "peak_host_rss_gb": 4.0 - 2.0 * fraction,
    }


def write_metrics(run_dir: str) -> int:
    """Write NUM_METRIC_STEPS metrics lines derived from the point's offload fraction."""
    fraction = offload_fraction(_resolved_recipe(run_dir))
    with Path(run_dir, "metrics.jsonl").open("a") as stream:
        for step in range(1, NUM_METRIC_STEPS + 1):
            stream.write(json.dumps(expected_metrics(fraction, step)) + "\n")
    return 0


def sleep_forever(run_dir: str) -> int:
    Path(run_dir, "sleeping").write_text(str(os.getpid()))
    while True:
        time.sleep(1)


def container_env(run_dir: str) -> int:
    """Record each node's PYXIS_STANDIN_* variables (one Ray task pinned to every node)."""
    import ray

    from hpcrl.job.ray_cluster import node_resource_name

    def read_env(rank: int) -> dict:
        import socket

        names = sorted(name for name in os.environ if name.startswith("PYXIS_STANDIN_"))
        return {
            "rank": rank,
            "host": socket.gethostname(),
            "env": {n: os.environ[n] for n in names},
        }

    remote = ray.remote(num_cpus=0)(read_env)
    num_nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    futures = [
        remote.options(resources={node_resource_name(r): 0.001}).remote(r) for r in range(num_nodes)
    ]
    Path(run_dir, "container_env.json").write_text(json.dumps(ray.get(futures, timeout=60)))
    return 0


def record_gpus(run_dir: str) -> int:
    """Record the GPUs the job was given: CUDA_VISIBLE_DEVICES and Ray's GPU resource."""
    import ray

    seen = {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ray_gpus": ray.cluster_resources().get("GPU", 0),
    }
    Path(run_dir, "gpus.json").write_text(json.dumps(seen))
    return 0
