"""The callable submitit pickles and runs on every task of a job: hpcrl's node entrypoint.

It marks the start of every attempt in the task's logs (``--open-mode=append`` keeps all
attempts in one file; ``hpcrl logs --attempt K`` splits on these lines), numbering attempts
through the run (``attempt_offset``: the attempts of the run's earlier jobs, when ``hpcrl
resume`` submitted this one into the same folder), and forwards
submitit's timeout/preemption ``checkpoint`` to the node entrypoint, so the driver can stop
cleanly before Slurm requeues the job. When the node entrypoint asks for a requeue after a
failure (a lost node), it requeues the job the way submitit does after a preemption.

The one module of the job side the login side imports: ``hpcrl submit`` constructs the
``NodeTask`` that submitit pickles into the run folder (its module path is part of the
run-folder contract). So it imports nothing heavy: the node entrypoint is imported only
inside the job.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from submitit.core.utils import DelayedSubmission
from submitit.helpers import Checkpointable

from hpcrl.job.slurm_env import ATTEMPT_OFFSET_VARIABLE, banner_of  # light: attrs only


def _load_entrypoint() -> Any:
    """``hpcrl.job.node.NodeMain()`` when the node entrypoint offers one (it then handles
    preemption itself), else ``hpcrl.job.node.main``."""
    from hpcrl.job import node  # in-job only: the node entrypoint may import Ray

    node_main_class = getattr(node, "NodeMain", None)
    return node_main_class() if node_main_class is not None else node.main


#: What task 0 exits with once it requeued the job (submitit's own requeue exits -1 too):
#: it leaves no result file, so nothing reads this attempt as the job's end.
REQUEUED_EXIT_CODE = -1
SCONTROL_TIMEOUT_S = 60


def requeue_after_failure(task: NodeTask, run_dir: str, cause: str) -> None:
    """Requeue the running job with ``task`` as what the next attempt runs: submitit's own
    steps after a preemption (the next attempt's pickle, then ``scontrol requeue``), for an
    attempt that failed in a way the next may not (``hpcrl.job.node.NodeMain``).

    When Slurm refuses, the attempt's cause record says so and the job fails as it is."""
    import subprocess

    import submitit
    from submitit.core.utils import temporary_save_path

    environment = submitit.JobEnvironment()
    pickle_path = environment.paths.submitted_pickle
    current = DelayedSubmission.load(pickle_path)
    delayed = DelayedSubmission(task, run_dir)
    delayed.set_timeout(current._timeout_min, current._timeout_countdown)
    with temporary_save_path(pickle_path) as partial:
        delayed.dump(partial)
    command = ["scontrol", "requeue", environment.job_id]
    previous = ignore_slurms_term()
    try:
        subprocess.run(command, check=True, timeout=SCONTROL_TIMEOUT_S, capture_output=True)
    except (OSError, subprocess.SubprocessError) as error:
        _requeue_refused(run_dir, f"{' '.join(command)} failed: {error}")
        raise RuntimeError(f"{cause}; the requeue failed: {error}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"hpcrl: requeued job {environment.job_id}: {cause}", file=sys.stderr, flush=True)


def ignore_slurms_term() -> Any:
    """Ignore SIGTERM in this process and the programs it starts from now on (an ignored
    signal stays ignored across exec, in sh too); returns the handler it replaces.

    Slurm's requeue ends the running attempt at once: SIGCONT and SIGTERM to every process
    of the job step, the ``scontrol requeue`` that asked for it included. On a loaded node
    the signal lands before scontrol exits, so the requeue happens yet reads as failed (CI,
    2026-12-07: submitit then wrote an error result for task 0 and the job looked over
    while its next attempt started). SIGKILL after Slurm's KillWait still ends them all.
    Main thread only (``signal.signal``): submitit's signal handler and ``NodeTask.__call__``.
    """
    return signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _requeue_refused(run_dir: str, why: str) -> None:
    import attrs

    from hpcrl.run.causes import latest_cause, write_cause

    cause = latest_cause(Path(run_dir))
    if cause is not None:
        detail = f"{cause.detail}; not requeued: {why}".lstrip("; ")
        write_cause(Path(run_dir), attrs.evolve(cause, requeued=False, detail=detail))


#: submitit's local executor takes a task exiting with this for a requeue request
#: (``submitit.local.local.LOCAL_REQUEUE_RETURN_CODE``): a driver's 144 leaves Python's 1.
LOCAL_REQUEUE_EXIT_CODE = 144


def exit_now(code: int) -> None:
    """End the task's process with ``code`` (Python would exit 1 after an uncaught
    exception), its output flushed; the task has stopped Ray and its driver already."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def one_line_for_explained_failures(fallback: Any, exit_with: Any = exit_now) -> Any:
    """An excepthook for the task's process: a failure hpcrl already explained (a bootstrap or
    preflight failure, a driver that exited non-zero: the driver's own traceback is in its
    ``driver.log``) ends the task's stderr as one line instead of a second traceback. submitit
    re-raises the task's exception at the top of its process; anything else keeps its stack.

    A failed driver's exit code becomes the task's (``exit_with``), so through srun the job
    ends in Slurm's records with the driver's code (137 for a driver the OOM killer killed),
    not Python's 1."""

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        from hpcrl.job.errors import BootstrapError, DriverFailed

        if isinstance(error, DriverFailed | BootstrapError):
            summary = getattr(error, "summary", None) or str(error).splitlines()[0]
            print(f"hpcrl: job failed: {summary}", file=sys.stderr, flush=True)
            code = getattr(error, "exit_code", 1)
            if isinstance(error, DriverFailed) and 1 < code < 256:
                exit_with(1 if code == LOCAL_REQUEUE_EXIT_CODE else code)
            return
        fallback(kind, error, trace)

    return hook


class NodeTask(Checkpointable):
    """``NodeTask()(run_dir)`` runs the node entrypoint for ``run_dir`` and returns its exit
    code (task 0's is the driver's).

    ``entrypoint``: the node entrypoint to call; None loads it in the job. After a
    preemption it is the entrypoint's own resubmission (which counts its requeues).
    ``attempt_offset``: attempts the run's earlier jobs made (0 for a run's first job).
    """

    def __init__(self, entrypoint: Any = None, attempt_offset: int = 0) -> None:
        self._entrypoint = entrypoint
        self._attempt_offset = attempt_offset

    def __call__(self, run_dir: str) -> int:
        sys.excepthook = one_line_for_explained_failures(sys.excepthook)
        # Everything of the job after this (preflight, node entrypoint, driver) numbers its
        # attempt folders from here.
        os.environ[ATTEMPT_OFFSET_VARIABLE] = str(self._attempt_offset)
        banner = banner_of(os.environ, self._attempt_offset)
        for stream in (sys.stdout, sys.stderr):
            print(banner, file=stream, flush=True)
        # Before the node entrypoint is even imported (it imports psutil, then Ray): a Python
        # that lacks them fails here in seconds, naming each package and the fix.
        from hpcrl.job.preflight import run_preflight

        run_preflight(run_dir, os.environ, getattr(self._entrypoint, "num_requeues", 0))
        if self._entrypoint is None:
            self._entrypoint = _load_entrypoint()
        from hpcrl.job.errors import RequeueRequested, SlurmRequeues

        try:
            return self._entrypoint(run_dir)
        except SlurmRequeues as requeued:
            print(f"hpcrl: {requeued}", file=sys.stderr, flush=True)
            raise SystemExit(REQUEUED_EXIT_CODE) from None
        except RequeueRequested as request:
            requeue_after_failure(
                NodeTask(request.resubmission, self._attempt_offset), run_dir, request.cause
            )
            raise SystemExit(REQUEUED_EXIT_CODE) from None  # as submitit after its own requeue

    # submitit calls checkpoint with __call__'s arguments and takes None as "do not requeue"
    # (submitit/core/utils.py); Checkpointable annotates it (*args, **kwargs) -> DelayedSubmission.
    def checkpoint(self, run_dir: str) -> DelayedSubmission | None:  # type: ignore[override]
        """Called by submitit on task 0 when USR2 arrives; None means "do not requeue"."""
        entry_checkpoint = getattr(self._entrypoint, "checkpoint", None)
        entrypoint = self._entrypoint
        if entry_checkpoint is not None:
            resubmission = entry_checkpoint(run_dir)
            if resubmission is None:
                return None
            entrypoint = resubmission.function
        # submitit runs ``scontrol requeue`` next and then exits, and that scontrol must live
        # to report the requeue done (Ray and the driver, started earlier, keep their handlers)
        ignore_slurms_term()
        return DelayedSubmission(NodeTask(entrypoint, self._attempt_offset), run_dir)
