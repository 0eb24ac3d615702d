"""Child processes the node entrypoint owns: started in their own session, stopped as a whole.

Ray's ``ray start --block`` spawns gcs_server, raylet, agents and workers. Each child we start
gets its own session (setsid), so at the end every process of that session — whatever Ray
spawned — can be found and stopped, without touching a simulated neighbour node's Ray on the
same machine (never ``ray stop``, which stops every Ray of the machine).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

LEFTOVER_GRACE_S = 0.5  # the leader already stopped Ray in order; what is left is stragglers


def start_in_own_session(
    argv: Sequence[str], *, env: Mapping[str, str], stdout_path: Path, stderr_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session, appending its output to two files.

    The child starts with SIGUSR2 ignored, and an ignored signal stays ignored across exec and
    fork: Slurm's ``--signal=USR2@N`` reaches *every* process of the step, and its default
    action would kill Ray's gcs_server, raylet and workers and the driver before anyone could
    checkpoint. Only the entrypoint reacts (it writes the PREEMPT marker); the training loop
    installs its own handler, which replaces the ignore in the driver.
    """
    stdout_path.parent.mkdir(parents=True, exist_ok=True)
    with open(stdout_path, "ab") as stdout, open(stderr_path, "ab") as stderr:
        return subprocess.Popen(
            list(argv), env=dict(env), stdout=stdout, stderr=stderr,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_ignore_usr2,
        )  # fmt: skip


def _ignore_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies.

    Our children run in their own sessions, so nothing else ends them when the node entrypoint
    is killed outright (SIGKILL, or submitit's local executor cancelling a job); Slurm's step
    cleanup would, a local run has none. ``ray start --block`` stops its processes on SIGTERM.
    """
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, int(signum), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def session_processes(session_id: int) -> list[psutil.Process]:
    """Every live process whose session is ``session_id`` (the leader's pid)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == session_id:
                found.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def stop_session(leader: subprocess.Popen[bytes], timeout_s: float) -> list[str]:
    """Stop the leader and everything of its session; returns the names that needed SIGKILL.

    The leader gets SIGTERM first and up to ``timeout_s`` to stop its own children in order
    (``ray start --block`` does); then whatever is left of the session, or of the leader's
    descendants, gets SIGTERM, a short grace and SIGKILL. Returns only once all are gone: a job
    step must not end while its children still run.
    """
    targets = _session_and_descendants(leader.pid)
    if leader.poll() is None:
        leader.send_signal(signal.SIGTERM)
        try:
            leader.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    targets.update(_session_and_descendants(leader.pid))
    left = [process for process in targets.values() if _running(process)]
    _signal_all(left, signal.SIGTERM)
    _, alive = psutil.wait_procs(left, timeout=LEFTOVER_GRACE_S)
    killed = [_name(process) for process in alive]
    _signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)
    if leader.poll() is None:
        leader.kill()
        leader.wait()
    return killed


def _session_and_descendants(leader_pid: int) -> dict[int, psutil.Process]:
    found = {process.pid: process for process in session_processes(leader_pid)}
    try:
        for child in psutil.Process(leader_pid).children(recursive=True):
            found.setdefault(child.pid, child)  # in case one left the session (setsid)
    except psutil.NoSuchProcess:
        pass
    found.pop(leader_pid, None)  # the leader is our child: waited on through Popen
    return found


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_all(processes, signum: int) -> None:
    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.NoSuchProcess:
            continue


def _name(process: psutil.Process) -> str:
    try:
        return f"{process.name()}[{process.pid}]"
    except psutil.Error:
        return f"pid {process.pid}"
