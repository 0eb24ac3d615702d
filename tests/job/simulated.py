"""Stand-in for a Slurm allocation: several "nodes" as processes on this machine's loopback.

Used where the test cluster is not needed (or not up): each simulated node is a real
``python -m hpcrl.job.node`` process with the SLURM_* variables Slurm would set for one task
per node, all named ``localhost``. Each node gets its own Ray ports (in a real job every node
uses the same ones, on its own IP) and its own temp dir, so real Ray runs on both.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import attrs
import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
PORT_SPAN = 400  # head ports, node ports and a 100-port worker range per node (2 nodes)
NODE_PORT_FIELDS = (
    "node_manager_port", "object_manager_port", "runtime_env_agent_port",
    "metrics_export_port", "dashboard_agent_grpc_port", "dashboard_agent_listen_port",
)  # fmt: skip


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_bands(count: int) -> list[int]:
    """``count`` per-job port bands (hpcrl.config.port_bands) whose ports are all free here."""
    from hpcrl.config.port_bands import BAND_SIZE, FIRST_BAND_PORT, NUM_BANDS

    free = []
    for band in range(NUM_BANDS - 1, -1, -1):  # from the top: clear of other tests' bands
        start = FIRST_BAND_PORT + band * BAND_SIZE
        if all(_free(port) for port in range(start, start + BAND_SIZE)):
            free.append(band)
        if len(free) == count:
            return free
    raise RuntimeError(f"fewer than {count} free Ray port bands on this machine")


def free_port_base(seed: int) -> int:
    """A base port under the ephemeral range with PORT_SPAN free ports above it."""
    for offset in range(0, 8000, PORT_SPAN):
        base = 20000 + (seed * PORT_SPAN + offset) % 8000
        if all(_free(port) for port in range(base, base + PORT_SPAN)):
            return base
    raise RuntimeError("no free port band in 20000-28000")


@attrs.define
class SimulatedJob:
    """One simulated job: its run folder, node count, ports and extra environment."""

    run_dir: Path
    num_nodes: int
    port_base: int
    job_id: str = attrs.field(factory=lambda: f"t{uuid.uuid4().hex[:8]}")
    extra_env: dict[str, str] = attrs.field(factory=dict)
    own_port_band: bool = False  # True: no HPCRL_RAY_*_PORT variables, the job's band decides

    @property
    def gcs_port(self) -> int:
        return self.port_base

    def write_plan(self) -> None:
        """The run folder with the job's plan (jobspec.json), as `hpcrl submit` leaves it."""
        from tests.job.plans import write_node_plan

        write_node_plan(self.run_dir, self.num_nodes)

    def node_port(self, rank: int, field: str) -> int:
        return self.port_base + 10 + 10 * rank + NODE_PORT_FIELDS.index(field)

    def node_env(self, rank: int) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCRL_", "RAY_"))
        }
        env |= {
            "PYTHONPATH": str(REPO_ROOT),
            "SLURM_JOB_ID": self.job_id, "SLURM_NODEID": str(rank), "SLURM_PROCID": str(rank),
            "SLURM_NNODES": str(self.num_nodes), "SLURMD_NODENAME": "localhost",
            "SLURM_JOB_NODELIST": ",".join(["localhost"] * self.num_nodes),
            "HPCRL_RAY_GCS_PORT": str(self.gcs_port),
            "HPCRL_RAY_CLIENT_SERVER_PORT": str(self.port_base + 1),
            "HPCRL_RAY_DASHBOARD_PORT": str(self.port_base + 2),
            "HPCRL_RAY_MIN_WORKER_PORT": str(self.port_base + 100 + 100 * rank),
            "HPCRL_RAY_MAX_WORKER_PORT": str(self.port_base + 199 + 100 * rank),
            "HPCRL_RAY_NUM_CPUS": "1", "HPCRL_RAY_OBJECT_STORE_MB": "100",
            "HPCRL_DRIVER": "hpcrl.job.probe:run_probe",
        }  # fmt: skip
        for field in NODE_PORT_FIELDS:
            env[f"HPCRL_RAY_{field.upper()}"] = str(self.node_port(rank, field))
        if self.own_port_band:
            env = {name: value for name, value in env.items() if not name.endswith("_PORT")}
        return env | self.extra_env

    def start_node(self, rank: int, entry: str = "main", **env: str) -> subprocess.Popen[str]:
        """Start simulated node ``rank`` running ``hpcrl.job.node.main`` (or ``NodeMain``)."""
        code = {
            "main": "import sys; from hpcrl.job.node import main; sys.exit(main(sys.argv[1]))",
            "NodeMain": "import sys; from hpcrl.job.node import NodeMain; NodeMain()(sys.argv[1])",
        }[entry]
        return subprocess.Popen(
            [sys.executable, "-c", code, str(self.run_dir)], env=self.node_env(rank) | env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
        )  # fmt: skip


@attrs.frozen
class NodeResult:
    exit_code: int
    output: str
    elapsed_s: float


def wait_node(process: subprocess.Popen[str], started: float, timeout_s: float = 180) -> NodeResult:
    output, _ = process.communicate(timeout=timeout_s)
    return NodeResult(process.returncode, output, time.monotonic() - started)


def processes_of_job(job: SimulatedJob) -> list[str]:
    """Processes of the job still running: Ray's (their command lines name the job's Ray temp
    dirs, which contain the job id) and the driver's (it names the run folder)."""
    markers = (job.job_id, str(job.run_dir))
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["status"] != psutil.STATUS_ZOMBIE and any(m in cmdline for m in markers):
            found.append(f"{process.info['pid']}: {cmdline[:120]}")
    return found
