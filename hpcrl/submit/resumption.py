"""``hpcrl resume``: the next attempt of a run, in its own folder, from its last checkpoint.

The run folder is the record of what ran, so nothing is rendered again: its ``job.sbatch``
and ``jobspec.json`` are submitted as a new job. That job numbers its attempts after the
earlier jobs' (``logs/node<k>/attempt<r>/`` and the attempt banners of ``hpcrl logs``), so
each attempt's logs stay apart; its driver restores the newest complete checkpoint, as
after a requeue, and drops the metrics lines of the steps it runs again.
``job.json`` then names the new job, with the earlier ones in ``earlier_job_ids``.

A run is resumed only when its job has ended without finishing (failed, cancelled, timed
out, preempted, or gone from the scheduler), has a complete checkpoint, and its plan is one
this hpcrl can run; otherwise the refusal says why and what to do instead (``hpcrl rerun``
starts a new run from the same recipe).
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from hpcrl.config.errors import UserError
from hpcrl.run.job_record import JobRecord, read_job_record
from hpcrl.run.jobspec import JobSpec
from hpcrl.submit.hints import command
from hpcrl.submit.job_state import query_status, results_written
from hpcrl.submit.job_status import JobStatus

RESUMABLE_STATES = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
     "DEADLINE", "LOST", "STALE", "REVOKED"}
)  # fmt: skip
_ATTEMPT_DIR = re.compile(r"attempt([0-9]+)")


class ResumeRefused(UserError):
    """The run cannot be resumed as it is; the message says why, the fix what to do."""


@attrs.frozen(kw_only=True)
class ResumePoint:
    """What a resumed attempt starts from."""

    run_dir: Path
    spec: JobSpec
    previous: JobRecord
    previous_status: JobStatus
    checkpoint: Path  # the newest complete checkpoint, which the driver restores
    checkpoint_step: int
    attempt_offset: int  # attempts the run's jobs made so far


def rerun_fix(run_dir: Path) -> str:
    return f"start a new run from its recipe instead: {command('rerun', run_dir)}"


def check_resumable(run_dir: Path) -> ResumePoint:
    """Everything ``resume_run`` needs, or ResumeRefused naming the first thing in the way."""
    record = read_job_record(run_dir)  # RunFolderError for a folder that was never submitted
    status = query_status(record)
    _check_ended(run_dir, record, status)
    spec = _usable_plan(run_dir)
    checkpoint, step = _latest_checkpoint(run_dir)
    return ResumePoint(
        run_dir=run_dir, spec=spec, previous=record, previous_status=status,
        checkpoint=checkpoint, checkpoint_step=step,
        attempt_offset=max(record.attempt_offset + status.attempts, _attempt_folders(run_dir)),
    )  # fmt: skip


def _check_ended(run_dir: Path, record: JobRecord, status: JobStatus) -> None:
    if status.state == "COMPLETED":
        raise ResumeRefused(
            f"{run_dir}: job {record.job_id} completed; there is nothing left to resume",
            f"to train on, start a new run from its recipe with more steps, e.g. "
            f"{command('rerun', run_dir, 'grpo.max_num_steps=N')} (sft.max_num_steps for SFT)",
        )
    if status.state in RESUMABLE_STATES or (status.state == "UNKNOWN" and results_written(record)):
        return
    if status.is_final:  # a final state hpcrl does not resume from
        raise ResumeRefused(
            f"{run_dir}: job {record.job_id} ended {status.state}", rerun_fix(run_dir)
        )
    raise ResumeRefused(
        f"{run_dir}: job {record.job_id} is {status.state} (it has not ended"
        + (f"; the scheduler: {status.scheduler_error}" if status.scheduler_error else "")
        + ")",
        f"wait for it to end ({command('status', run_dir)}), or cancel it first "
        f"({command('cancel', run_dir)})",
    )


def _usable_plan(run_dir: Path) -> JobSpec:
    from hpcrl.run.jobspec_file import JobSpecError, read_jobspec

    try:
        spec = read_jobspec(run_dir)
    except JobSpecError as error:
        raise ResumeRefused(
            f"{run_dir}: its plan cannot be run again: {error}", rerun_fix(run_dir)
        ) from None
    bundle = spec.code.bundle
    if bundle is not None and not Path(bundle.path).is_dir():
        raise ResumeRefused(
            f"{run_dir}: the code bundle its job runs ({bundle.path}) is gone", rerun_fix(run_dir)
        )
    return spec


def _latest_checkpoint(run_dir: Path) -> tuple[Path, int]:
    from hpcrl.config import load_recipe
    from hpcrl.render.run_folder import RESOLVED_RECIPE_NAME
    from hpcrl.run.checkpoints import checkpoint_folder, complete_checkpoints

    cfg = load_recipe(run_dir / RESOLVED_RECIPE_NAME).recipe.checkpointing
    folder = checkpoint_folder(cfg.checkpoint_dir, run_dir)
    found = complete_checkpoints(folder)
    if not found:
        why = "" if cfg.enabled else " (checkpointing.enabled is false)"
        raise ResumeRefused(
            f"{run_dir}: no complete checkpoint in {folder}{why}; a resumed attempt would "
            "start again at step 1",
            rerun_fix(run_dir) + " (with checkpointing.enabled=true checkpointing.save_period=N "
            "it can be resumed next time)",
        )
    step, path = found[-1]
    return path, step


def _attempt_folders(run_dir: Path) -> int:
    """One more than the highest ``logs/node<k>/attempt<r>/`` any node wrote (0: none)."""
    numbers = [
        int(match[1])
        for path in (run_dir / "logs").glob("node*/attempt*")
        if (match := _ATTEMPT_DIR.fullmatch(path.name))
    ]
    return max(numbers, default=-1) + 1


def resume_run(run_dir: Path) -> tuple[ResumePoint, JobRecord]:
    """Check the run and submit its job again as its next attempt (under the run folder's
    lock, so two resumes cannot both submit); what it resumes from and the new job's record."""
    from hpcrl.render.run_folder import SCRIPT_NAME
    from hpcrl.run.folder_lock import run_folder_lock
    from hpcrl.submit.submission import submit_job

    with run_folder_lock(run_dir, command="hpcrl resume"):
        point = check_resumable(run_dir)
        previous = point.previous
        record = submit_job(
            point.spec,
            run_dir / SCRIPT_NAME,
            attempt_offset=point.attempt_offset,
            earlier_job_ids=(*previous.earlier_job_ids, previous.job_id),
            array_index=previous.array_index,
            sweep_dir=previous.sweep_dir,
        )
    return point, record
