"""The callable submitit pickles and runs on every task of a job: hpcrl's node entrypoint.

It marks the start of every attempt in the task's logs (``--open-mode=append`` keeps all
attempts in one file; ``hpcrl logs --attempt K`` splits on these lines) and forwards
submitit's timeout/preemption ``checkpoint`` to the node entrypoint, so the driver can stop
cleanly before Slurm requeues the job. Imports nothing heavy: the node entrypoint is imported
only inside the job.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import sys
from typing import Any

from submitit.core.utils import DelayedSubmission
from submitit.helpers import Checkpointable

#: ``===== hpcrl attempt 2 · job 41 · node 0 (n1) · 2026-11-29T10:40:00+00:00 =====``
ATTEMPT_BANNER_RE = re.compile(r"^===== hpcrl attempt (?P<attempt>\d+) · ")


def job_id_of(env: dict[str, str]) -> str:
    """The job's id as hpcrl shows it: ``20_3`` for array task 3 of array 20 (Slurm gives each
    task an id of its own, e.g. 23, that no hpcrl command shows), else the job id."""
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID", "?")


def attempt_banner(env: dict[str, str]) -> str:
    attempt = int(env.get("SLURM_RESTART_COUNT", "0")) + 1
    job_id = job_id_of(env)
    node = env.get("SLURM_NODEID", "0")
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return f"===== hpcrl attempt {attempt} · job {job_id} · node {node} ({socket.gethostname()}) · {now} ====="


def _load_entrypoint() -> Any:
    """``hpcrl.job.node.NodeMain()`` when the node entrypoint offers one (it then handles
    preemption itself), else ``hpcrl.job.node.main``."""
    from hpcrl.job import node  # in-job only: the node entrypoint may import Ray

    node_main_class = getattr(node, "NodeMain", None)
    return node_main_class() if node_main_class is not None else node.main


def one_line_for_explained_failures(fallback: Any) -> Any:
    """An excepthook for the task's process: a failure hpcrl already explained (a bootstrap or
    preflight failure, a driver that exited non-zero: the driver's own traceback is in its
    ``driver.log``) ends the task's stderr as one line instead of a second traceback. submitit
    re-raises the task's exception at the top of its process; anything else keeps its stack."""

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        from hpcrl.job.errors import BootstrapError, DriverFailed

        if isinstance(error, DriverFailed | BootstrapError):
            summary = getattr(error, "summary", None) or str(error).splitlines()[0]
            print(f"hpcrl: job failed: {summary}", file=sys.stderr, flush=True)
            return
        fallback(kind, error, trace)

    return hook


class NodeTask(Checkpointable):
    """``NodeTask()(run_dir)`` runs the node entrypoint for ``run_dir`` and returns its exit
    code (task 0's is the driver's).

    ``entrypoint``: the node entrypoint to call; None loads it in the job. After a
    preemption it is the entrypoint's own resubmission (which counts its requeues).
    """

    def __init__(self, entrypoint: Any = None) -> None:
        self._entrypoint = entrypoint

    def __call__(self, run_dir: str) -> int:
        sys.excepthook = one_line_for_explained_failures(sys.excepthook)
        banner = attempt_banner(dict(os.environ))
        for stream in (sys.stdout, sys.stderr):
            print(banner, file=stream, flush=True)
        # Before the node entrypoint is even imported (it imports psutil, then Ray): a Python
        # that lacks them fails here in seconds, naming each package and the fix.
        from hpcrl.job.preflight import run_preflight

        run_preflight(run_dir, os.environ, getattr(self._entrypoint, "num_requeues", 0))
        if self._entrypoint is None:
            self._entrypoint = _load_entrypoint()
        return self._entrypoint(run_dir)

    def checkpoint(self, run_dir: str) -> DelayedSubmission | None:
        """Called by submitit on task 0 when USR2 arrives; None means "do not requeue"."""
        entry_checkpoint = getattr(self._entrypoint, "checkpoint", None)
        if entry_checkpoint is None:
            return DelayedSubmission(NodeTask(self._entrypoint), run_dir)
        resubmission = entry_checkpoint(run_dir)
        if resubmission is None:
            return None
        return DelayedSubmission(NodeTask(resubmission.function), run_dir)
