"""Which scheduler records are a run's own job: its id *and* its submit time and cluster.

Job ids repeat: a Slurm cluster set up again starts at 1 while its accounting database may
keep the old jobs, and pids are reused. The sacct rows of a job are the one submitted within
``SUBMIT_SLACK_S`` of ``JobRecord.submitted_at`` on the recorded cluster and the requeued
attempts that follow it (a requeue gets a row of its own, with the requeue's submit time);
rows of that id that do not match are another job's. A local job's pid is its controller
only while that process started when the job was submitted.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from pathlib import Path

from hpcrl.run.job_record import JobRecord

#: How far the scheduler's submit time (or a local controller's start) may lie from the
#: record's: the login node's and the controller's clocks, and sbatch's own time.
SUBMIT_SLACK_S = 300.0
#: Right after submission sacct may not list the new job yet but still list an older job of
#: the same id: only a record older than this is called STALE (until then: UNKNOWN).
STALE_AFTER_S = 60.0
#: A job's attempt that ended so: the next row of its id is not a requeue of it.
_ENDED_FOR_GOOD = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


def state_word(state: str) -> str:
    # sacct writes "CANCELLED by 0"; the first word is the state.
    return state.split()[0].upper() if state.strip() else "UNKNOWN"


def rows_of_record(
    rows: Sequence[dict[str, str]], record: JobRecord, slack_s: float = SUBMIT_SLACK_S
) -> tuple[list[dict[str, str]], str | None]:
    """The rows (attempts) of ``record``'s own job among sacct's rows of its id: the row
    submitted within ``slack_s`` of the record (on its cluster, when both are known), then
    every row requeued from it. None matching: ([], why); rows without a Submit time are
    taken as they come."""
    if not rows or "Submit" not in rows[0]:
        return list(rows), None
    submitted = record_time(record)
    for start, row in enumerate(rows):
        if _same_job(row, record, submitted, slack_s):
            own = [row]
            for later in rows[start + 1 :]:
                if state_word(own[-1].get("State", "")) in _ENDED_FOR_GOOD:
                    break
                own.append(later)
            return own, None
    return [], _stale_reason(rows[-1], record)


def _same_job(row: dict[str, str], record: JobRecord, submitted: float, slack_s: float) -> bool:
    cluster = row.get("Cluster", "")
    if record.slurm_cluster and cluster and cluster != record.slurm_cluster:
        return False
    text = row.get("Submit", "")
    # No submit time (sacct always prints one; a stand-in may not): nothing to tell it by.
    return not text.isdigit() or abs(int(text) - submitted) <= slack_s


def record_time(record: JobRecord) -> float:
    return datetime.datetime.fromisoformat(record.submitted_at).timestamp()


def _stale_reason(row: dict[str, str], record: JobRecord) -> str:
    text = row.get("Submit", "")
    when = (
        datetime.datetime.fromtimestamp(int(text), datetime.UTC).isoformat(timespec="seconds")
        if text.isdigit()
        else "at an unknown time"
    )
    cluster = row.get("Cluster") or "?"
    mine = f" on {record.slurm_cluster}" if record.slurm_cluster else ""
    return (
        f"the scheduler's job {record.job_id} is another job (submitted {when} on cluster "
        f"{cluster}, {state_word(row.get('State', ''))}); this run's job {record.job_id} was "
        f"submitted {record.submitted_at}{mine} and is no longer on record (job ids began "
        "again, e.g. after the cluster was reinstalled)"
    )


def process_start_time(start_ticks: int) -> float | None:
    """Wall time a process started, from its start in clock ticks since boot."""
    try:
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")
