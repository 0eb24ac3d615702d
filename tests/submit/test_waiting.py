"""When ``hpcrl submit --wait`` stops waiting, and what the progress line says (no cluster:
the scheduler's answers are given as JobStatus values; submitit's files are real files)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from hpcrl.submit import waiting
from hpcrl.submit.job_record import JobRecord
from hpcrl.submit.job_state import JobStatus
from hpcrl.submit.logs import split_attempts
from hpcrl.submit.node_task import attempt_banner


def _record(tmp_path: Path, num_tasks: int = 2) -> JobRecord:
    return JobRecord(
        executor="slurm", job_id="41", job_name="j", cluster="c",
        submitit_folder=str(tmp_path / "submitit"), num_tasks=num_tasks,
        submitted_at="2026-11-29T10:00:00+00:00", max_requeues=1,
    )  # fmt: skip


def _fast(**changes: float) -> waiting.WaitSettings:
    return waiting.WaitSettings(poll_s=0.01, sacct_lag_s=0.05, unknown_grace_s=0.05,
                                unreachable_grace_s=0.05, **changes)  # fmt: skip


def test_progress_line_follows_the_run_folder(tmp_path: Path) -> None:
    running = JobStatus(state="RUNNING")
    assert waiting.describe_progress(tmp_path, JobStatus(state="PENDING"), 20) == "queued"
    assert waiting.describe_progress(tmp_path, running, 20) == "running, starting Ray"
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "ray_ready").write_text(json.dumps({"attempt": "41.0"}))
    assert waiting.describe_progress(tmp_path, running, 20) == "Ray ready, driver starting"
    # a marker of an earlier attempt is stale
    requeued = JobStatus(state="RUNNING", attempts=2)
    assert waiting.describe_progress(tmp_path, requeued, 20) == "running, starting Ray (attempt 2)"
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 3, "reward_mean": 0.25, "loss": 1.5}\n{"step": 4, "lo'
    )
    assert (
        waiting.describe_progress(tmp_path, running, 20)
        == "training step 3/20 · reward 0.25 · loss 1.5"
    )


@pytest.mark.parametrize(
    ("statuses", "results", "final_state"),
    [
        ([JobStatus(state="RUNNING"), JobStatus(state="COMPLETED")], False, "COMPLETED"),
        ([JobStatus(state="RUNNING")] * 50, True, "ENDED"),  # sacct lags or is down
        ([JobStatus(state="UNKNOWN")] * 50, False, "LOST"),
        ([JobStatus(state="RUNNING", scheduler_error="sacct exited 1")] * 50, False, "UNREACHABLE"),
    ],
)
def test_waiting_always_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, statuses: list, results: bool, final_state: str
) -> None:
    record = _record(tmp_path)
    if results:
        (tmp_path / "submitit").mkdir()
        for task in range(record.num_tasks):
            (tmp_path / "submitit" / f"41_{task}_result.pkl").write_bytes(b"")
    answers = iter(statuses)
    monkeypatch.setattr(waiting, "query_status", lambda _record: next(answers))
    seen: list[JobStatus] = []
    monkeypatch.setattr(
        waiting, "read_outcome", lambda _r, _d, status: seen.append(status) or _Outcome()
    )
    monkeypatch.setattr(waiting, "report_outcome", lambda *args: None)
    console = _quiet_console()
    waiting.wait_for_job(tmp_path, record, console, settings=_fast())
    assert seen[0].state == final_state
    # without a terminal, progress is one line per change (CI logs stay readable)
    lines = [line.split("] ", 1)[1] for line in console.file.getvalue().splitlines()]
    first = {"RUNNING": "job 41: running, starting Ray", "UNKNOWN": "job 41: queued"}[
        statuses[0].state
    ]
    assert lines[0].startswith(first) and len(lines) == len(set(lines))


class _Outcome:
    exit_code = 0


def _quiet_console() -> Console:
    return Console(file=io.StringIO())


def test_attempt_banners_split_appended_logs() -> None:
    first = attempt_banner({"SLURM_RESTART_COUNT": "0", "SLURM_JOB_ID": "41", "SLURM_NODEID": "0"})
    second = attempt_banner({"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "41", "SLURM_NODEID": "0"})
    assert first.startswith("===== hpcrl attempt 1 · job 41 · node 0 (")
    text = f"srun noise\n{first}\nstep 1\n{second}\nstep 1 again\n"
    parts = split_attempts(text)
    assert parts[1] == f"srun noise\n{first}\nstep 1\n"
    assert parts[2] == f"{second}\nstep 1 again\n"
