"""Slurm's own requeues, seen from node 0 at the start of an attempt.

Slurm requeues a job by itself when a node of it fails (``NODE_FAIL``: the node's slurmd
stopped answering and slurmctld marked it DOWN) and the job may be requeued. That attempt's
node 0 was killed with the whole step and named nothing, so the next attempt's node 0 names
it (``status/cause.<r>.json``, from srun's ``Node failure on <node>``), and Slurm's requeues
count against the profile's ``max_requeues`` like hpcrl's own: the attempt that uses the last
requeue makes the job non-requeueable (``scontrol update ... Requeue=0``), so a node failure
then ends the job instead of starting one attempt more than the profile allows.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from hpcrl.job.settings import NodeSettings
from hpcrl.run.causes import read_cause, slurm_node_failure, write_cause
from hpcrl.run.markers import DONE, read_marker

SCONTROL_TIMEOUT_S = 30


def task0_err_log() -> Path | None:
    """This task's stderr file under submitit (node 0 runs task 0), None outside submitit."""
    try:
        import submitit

        return Path(submitit.JobEnvironment().paths.stderr)
    except Exception:  # not started by submitit (``srun python -m hpcrl.job.node``)
        return None


def name_slurm_ended_attempt(settings: NodeSettings, task0_err_log: Path | None) -> None:
    """Write the cause of the previous attempt of this job when Slurm ended it NODE_FAIL and
    requeued it (it has no cause record and node 0 never marked it done)."""
    task = settings.task
    if task.attempt == 0 or task0_err_log is None:
        return
    previous = task.run_attempt - 1
    if read_cause(settings.run_dir, previous) is not None:
        return
    if read_marker(settings.run_dir, DONE, f"{task.job_id}.{task.attempt - 1}") is not None:
        return
    cause = slurm_node_failure(settings.run_dir, previous, task0_err_log, requeued=True)
    if cause is not None:
        write_cause(settings.run_dir, cause)
        logging.getLogger("hpcrl.job").warning("attempt %d: %s", previous + 1, cause.line())


def stop_slurm_requeues_when_used_up(settings: NodeSettings, logger: logging.Logger) -> None:
    """From the attempt that used the last requeue on (SLURM_RESTART_COUNT counts Slurm's
    and hpcrl's alike), Slurm must not requeue the job again."""
    if not settings.task.in_slurm or settings.task.attempt < settings.max_requeues:
        return
    command = ["scontrol", "update", f"JobId={settings.task.job_id}", "Requeue=0"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, errors="replace",
                              timeout=SCONTROL_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("%s failed: %s; a node failure may requeue the job again", command, error)
        return
    if proc.returncode != 0:
        logger.warning("%s failed: %s; a node failure may requeue the job again",
                       " ".join(command), " ".join(proc.stderr.split()))  # fmt: skip
        return
    logger.info("%d of %d requeues used: Slurm will not requeue the job again (Requeue=0)",
                settings.task.attempt, settings.max_requeues)  # fmt: skip
