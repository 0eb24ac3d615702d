"""What the scheduler says about one job right now (``JobStatus``), as ``hpcrl.submit.
job_state`` reads it and the failure, progress and status views take it."""

from __future__ import annotations

import attrs

#: sacct states after which the job will not run again (no requeue pending).
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
     "DEADLINE", "PREEMPTED_FINAL", "REVOKED", "LOST", "STALE"}
)  # fmt: skip
#: Every state ``hpcrl status`` can show (and ``--state`` filters by): Slurm's job states,
#: hpcrl's own (a run never submitted, a job sacct forgot or cannot answer for).
RUN_STATES = FINAL_STATES | frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "PREEMPTED", "REQUEUED", "REQUEUE_FED",
     "REQUEUE_HOLD", "RESIZING", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED",
     "NOT_SUBMITTED", "UNKNOWN", "UNREACHABLE"}
)  # fmt: skip


@attrs.frozen(kw_only=True)
class JobStatus:
    """What the scheduler says about one job right now.

    state: sacct's state word (``RUNNING``, ``COMPLETED``, ``CANCELLED``, ...) or ``UNKNOWN``
    when the scheduler has no record yet. exit_code: sacct's, None while running.
    """

    state: str
    attempts: int = 1
    elapsed_s: float | None = None
    started_at_s: float | None = None  # when the current attempt started (epoch s; sacct's)
    exit_code: int | None = None
    scheduler_error: str | None = None  # sacct failed: the state is submitit's last known one
    reason: str | None = None  # why a pending job waits (Priority, Resources, ...): squeue's
    states: tuple[str, ...] = ()  # each attempt's state word, oldest first (sacct's rows)
    stale: str | None = None  # state STALE: whose the scheduler's records of this id are

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES
