"""What ``hpcrl logs`` does, from run folders alone: print or follow the logs of a run, or of
a sweep's points (the files and their selection: ``hpcrl.submit.log_view``)."""

from __future__ import annotations

import sys
from pathlib import Path

from hpcrl.config.errors import UsageError
from hpcrl.submit.log_view import (
    LoggedRun,
    LogSelection,
    check_attempt,
    follow_logs,
    no_output_line,
    print_logs,
    runs_to_show,
)
from hpcrl.submit.waiting import default_wait_settings, jobs_end_check, why_waiting_ended


def show_logs(path: Path, selection: LogSelection, point: int | None, follow_job: bool) -> int:
    """``hpcrl logs``: print (or follow) the logs of a run, or of a sweep's points."""
    runs = runs_to_show(path, point)
    for run in runs:
        if selection.node is not None and not 0 <= selection.node < run.record.num_tasks:
            raise UsageError(
                f"--node {selection.node}: job {run.record.job_id} has nodes "
                f"0..{run.record.num_tasks - 1}",
                fix="give one of those, or leave --node out for every node",
            )
    check_attempt(runs, selection)
    if follow_job:
        return _follow(runs, selection)
    if not print_logs(runs, selection, sys.stdout):
        print(no_output_line(runs, selection, path), file=sys.stderr)
    return 0


def _follow(runs: list[LoggedRun], selection: LogSelection) -> int:
    def say(text: str) -> None:
        print(f"hpcrl logs: {text}", file=sys.stderr, flush=True)

    check = jobs_end_check([run.record for run in runs], say=say)
    ended: dict[int, str] = {}

    def is_over() -> bool:
        for index, state in enumerate(check()):
            if state is not None:
                ended.setdefault(index, state)
        return len(ended) == len(runs)

    follow_logs(runs, selection, is_over, default_wait_settings().poll_s, sys.stdout)
    for index, run in enumerate(runs):
        state = ended.get(index, "UNKNOWN")
        where = f"{run.point}: " if run.point else ""
        print(f"hpcrl logs: {where}job {run.record.job_id} {why_waiting_ended(state)}",
              file=sys.stderr)  # fmt: skip
    return 1 if any(state in ("LOST", "UNREACHABLE") for state in ended.values()) else 0
