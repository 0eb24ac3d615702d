"""Per-job Ray port bands: the ports a job's Ray uses, derived from the job's id.

Ports below Linux's ephemeral range (32768) are split into ``NUM_BANDS`` bands of
``BAND_SIZE`` ports from ``FIRST_BAND_PORT``. A job takes band ``key % NUM_BANDS``, where the
key is the Slurm job id (array tasks: array job id + task id, so the tasks of one array that
run together get neighbouring bands) or the local run's id. Every node of a job sees the same
ids, so all nodes agree on the band without talking; jobs whose keys differ by less than
``NUM_BANDS`` (Slurm numbers jobs in submission order) never share one.

Inside a band: the single ports at fixed offsets, then Ray's worker port range to the end.
A port the profile names (``ray_ports.<name>``) or the environment sets (``HPCRL_RAY_<NAME>``)
wins over the band; ``HPCRL_RAY_PORT_BAND`` picks the band itself.
Pure Python, no imports beyond the standard library: the login side validates against it.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

FIRST_BAND_PORT = 10000
BAND_SIZE = 512
NUM_BANDS = 44  # 10000 + 44 * 512 = 32528, below the ephemeral range at 32768
BAND_VARIABLE = "HPCRL_RAY_PORT_BAND"

# Offsets inside a band; 10..15 are spare, the worker range takes the rest.
SINGLE_OFFSETS = {
    "gcs_port": 0,
    "client_server_port": 1,
    "dashboard_port": 2,
    "node_manager_port": 3,
    "object_manager_port": 4,
    "runtime_env_agent_port": 5,
    "metrics_export_port": 6,
    "dashboard_agent_grpc_port": 7,
    "dashboard_agent_listen_port": 8,
    "torch_master_port": 9,
}
WORKER_OFFSET = 16


def bands_end() -> int:
    """The last port of the last band."""
    return FIRST_BAND_PORT + NUM_BANDS * BAND_SIZE - 1


def job_key(job_id: str, array_job_id: str | None = None, array_task_id: str | None = None) -> int:
    """The number a job's band comes from; equal on every node of the job."""
    if array_job_id and array_task_id and array_job_id.isdigit() and array_task_id.isdigit():
        return int(array_job_id) + int(array_task_id)
    digits = job_id.removeprefix("local")
    if digits.isdigit():
        return int(digits)
    return zlib.crc32(job_id.encode())  # stable across processes, unlike hash()


def band_ports(band: int) -> dict[str, int]:
    """Every Ray port of band ``band`` (0 <= band < NUM_BANDS)."""
    if not 0 <= band < NUM_BANDS:
        raise ValueError(f"port band {band} is not in 0..{NUM_BANDS - 1}")
    start = FIRST_BAND_PORT + band * BAND_SIZE
    ports = {name: start + offset for name, offset in SINGLE_OFFSETS.items()}
    ports["min_worker_port"] = start + WORKER_OFFSET
    ports["max_worker_port"] = start + BAND_SIZE - 1
    return ports


def job_ports(named: Mapping[str, int | None], band: int) -> dict[str, int]:
    """The band's ports, with every port that ``named`` sets (not None) kept as named."""
    kept = {name: int(port) for name, port in named.items() if port is not None}
    return {name: kept.get(name, port) for name, port in band_ports(band).items()}
