"""Helpers for tests that run against the real test Slurm cluster (tests/slurm/cluster.sh).

`require_slurm()` is the one gate: the suite's conftest calls it for every test marked
`slurm`. Other helpers run Slurm commands with deadlines and read what the cluster looks like.
"""

import os
import subprocess
import time
from pathlib import Path

from tests.require import is_required, unavailable

NODE_NAMES = ("n1", "n2")
NETNS_NODE_IPS = {"n1": "10.77.0.11", "n2": "10.77.0.12"}
START_COMMAND = "bash tests/slurm/cluster.sh start"
USABLE_NODE_STATES = {"idle", "alloc", "mix", "comp"}
SACCT_LAG_S = 15.0
"""sacct lags slurmctld by 1-2 s after a job ends; allow far more on a loaded machine."""


def cluster_root() -> Path:
    return Path(os.environ.get("HPCRL_SLURM_ROOT", "/tmp/hpcrl-slurm"))


def cluster_mode() -> str:
    """'netns' (own IP and hostname per node) or 'loopback' (fallback: all on 127.0.0.1)."""
    mode_file = cluster_root() / "mode"
    return mode_file.read_text().strip() if mode_file.exists() else "unknown"


def run_slurm(*args: str, timeout_s: float = 60.0, check: bool = True) -> str:
    """Run a Slurm client command and return its stdout; on failure show stdout and stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc.stdout


def _cluster_problem() -> str | None:
    """None when sinfo answers and every test node is usable, else what is wrong."""
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=20
        )
    except FileNotFoundError:
        return "sinfo is not installed"
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s"
    if proc.returncode != 0:
        return f"sinfo failed: {proc.stderr.strip()}"
    states = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
    # Exact match on purpose: a suffix means trouble ("idle*" = not responding).
    bad = {n: states.get(n, "missing") for n in NODE_NAMES}
    bad = {n: s for n, s in bad.items() if s not in USABLE_NODE_STATES}
    return f"nodes not usable: {bad}" if bad else None


def require_slurm() -> None:
    """Skip (locally) or fail (under CI, tests/require.py) unless the test cluster is up.

    Under CI the loopback fallback (network namespaces refused) counts as missing: in it the
    two nodes share one IP and hostname, so the tests that need distinct nodes cannot run and
    a multi-node bug could pass unseen."""
    problem = _cluster_problem()
    if problem is None and is_required("slurm") and cluster_mode() != "netns":
        problem = (
            f"it runs in {cluster_mode()!r} mode, not 'netns' (network namespaces refused? see "
            f"{cluster_root() / 'log'}); CI needs nodes with their own IPs"
        )
    if problem is not None:
        unavailable(
            "slurm",
            f"the Slurm test cluster is not usable ({problem}); run `{START_COMMAND}` as root",
        )


def require_netns_cluster(why: str) -> None:
    """For a test that needs distinct node IPs: skip in loopback mode (only reachable locally:
    under CI ``require_slurm`` already failed a loopback cluster)."""
    if cluster_mode() != "netns":
        unavailable(
            "slurm", f"{why} needs the netns test cluster; it runs in {cluster_mode()!r} mode"
        )


def sacct_states(job_id: str) -> list[str]:
    """Allocation-level states of every run of a job, oldest first (requeues add rows)."""
    out = run_slurm("sacct", "-n", "-X", "-D", "-P", "-o", "State", "-j", job_id)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sacct_exit_codes(job_id: str) -> list[str]:
    """Allocation-level ``ExitCode`` of every run of a job, oldest first, each ``code:signal``
    (Slurm 22.05 shows a batch status above 128 less 128, e.g. ``9:0`` for 137).
    ``DerivedExitCode`` (the highest code of the job's steps) is left out: a step's completion
    can reach slurmctld after the job's record is final, which then shows ``0:0``."""
    out = run_slurm("sacct", "-n", "-X", "-D", "-P", "-o", "ExitCode", "-j", job_id)
    return [line.strip() for line in out.splitlines() if line.strip()]


def wait_sacct_states(job_id: str, expected: list[str], timeout_s: float = SACCT_LAG_S) -> None:
    """Poll sacct until it reports exactly `expected` for the job, or fail with what it saw."""
    deadline = time.monotonic() + timeout_s
    states = sacct_states(job_id)
    while states != expected and time.monotonic() < deadline:
        time.sleep(0.25)
        states = sacct_states(job_id)
    assert states == expected, f"sacct states of job {job_id}: {states}, expected {expected}"


def wait_job_gone_from_queue(job_id: str, timeout_s: float) -> None:
    """Poll squeue until the job has left it (sbatch --wait polls with up to 32 s gaps)."""
    deadline = time.monotonic() + timeout_s
    while run_slurm("squeue", "-h", "-j", job_id, "-o", "%i", check=False).strip():
        assert time.monotonic() < deadline, f"job {job_id} still queued after {timeout_s} s"
        time.sleep(0.25)


def job_processes(job_id: str, variable: str = "SLURM_JOB_ID") -> list[str]:
    """Every process still alive that belongs to the job, on any node of this one-machine
    cluster: Slurm gives each task ``SLURM_JOB_ID`` (submitit's local executor
    ``SUBMITIT_LOCAL_JOB_ID``: pass that as ``variable``), and everything the task starts
    inherits it (Ray's raylet, its workers whatever their process title, a driver, vLLM
    engines), or names the job's Ray folder (``hpcrl-ray-<job>-<node>``) on its command line."""
    import psutil

    folder = f"hpcrl-ray-{job_id}-"
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(process.info["cmdline"] or [])
        try:
            in_job = process.environ().get(variable) == job_id
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            in_job = False
        if in_job or folder in cmdline:
            found.append(f"{process.info['pid']}: {cmdline[:120]}")
    return found


def job_processes_by_node(job_id: str) -> dict[str, list[str]]:
    """The job's live processes (``pid: command line``) by the node whose task started them
    (``SLURMD_NODENAME``, which Ray's raylet, its workers and the driver inherit)."""
    import psutil

    found: dict[str, list[str]] = {}
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            env = process.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if env.get("SLURM_JOB_ID") == job_id:
            cmdline = " ".join(process.info["cmdline"] or [])
            found.setdefault(env.get("SLURMD_NODENAME", "?"), []).append(
                f"{process.info['pid']}: {cmdline[:120]}"
            )
    return found


def wait_no_job_processes(
    job_id: str, timeout_s: float = 15.0, variable: str = "SLURM_JOB_ID"
) -> None:
    """Fail unless every process of the job is gone within ``timeout_s`` after it ended."""
    deadline = time.monotonic() + timeout_s
    left = job_processes(job_id, variable)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = job_processes(job_id, variable)
    assert left == [], f"processes of job {job_id} still running: {left}"
