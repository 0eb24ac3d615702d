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


class _FakeClock:
    """Time moves only when the wait loop sleeps."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def test_long_wait_prints_each_phase_once_plus_heartbeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polls every 10 s: 30 s pending on Priority, 20 s on Resources, then running; Ray ready
    at 80 s, steps 1..12 from 90 s (one per poll), completed at 210 s. Heartbeat 60 s."""
    clock = _FakeClock()
    metrics = tmp_path / "metrics.jsonl"

    def status_now(_record: JobRecord) -> JobStatus:
        t = clock.now_s - 1000.0
        if t < 30:
            return JobStatus(state="PENDING", reason="Priority")
        if t < 50:
            return JobStatus(state="PENDING", reason="Resources")
        if t >= 80:
            (tmp_path / "status").mkdir(exist_ok=True)
            (tmp_path / "status" / "ray_ready").write_text(json.dumps({"attempt": "41.0"}))
        if t >= 90:
            step = int(t - 90) // 10 + 1
            metrics.write_text(json.dumps({"step": step, "reward_mean": step / 100}) + "\n")
        return JobStatus(state="COMPLETED" if t >= 210 else "RUNNING")

    monkeypatch.setattr(waiting, "query_status", status_now)
    monkeypatch.setattr(waiting, "read_outcome", lambda *args: _Outcome())
    monkeypatch.setattr(waiting, "report_outcome", lambda *args: None)
    console = _quiet_console()
    settings = waiting.WaitSettings(poll_s=10.0, heartbeat_s=60.0)

    waiting.wait_for_job(
        tmp_path, _record(tmp_path), console, 12, settings, clock=clock, sleep=clock.sleep
    )

    assert console.file.getvalue().splitlines() == [
        "[     0s] job 41: queued (reason: Priority)",
        "[    30s] job 41: queued (reason: Resources)",
        "[    50s] job 41: running, starting Ray",
        "[  1m20s] job 41: Ray ready, driver starting",
        "[  1m30s] job 41: training step 1/12 · reward 0.01",
        "[  2m30s] job 41: training step 7/12 · reward 0.07",  # heartbeat: 60 s without a line
        "[  3m30s] job 41: completed",
    ]


def test_sacct_pending_reason_reaches_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcrl.submit import job_state

    rows = [{"JobID": "41", "State": "PENDING", "ExitCode": "0:0", "ElapsedRaw": "0",
             "Reason": "Priority"}]  # fmt: skip
    monkeypatch.setattr(job_state, "_sacct_rows", lambda job_id: rows)
    monkeypatch.setattr(job_state, "rebuild_job", lambda record: _Job())
    status = job_state.query_status(_record(Path("/nonexistent")))
    assert (status.state, status.reason) == ("PENDING", "Priority")
    rows[0] |= {"State": "RUNNING", "Reason": "None"}
    assert job_state.query_status(_record(Path("/nonexistent"))).reason is None


class _Job:
    def get_info(self, mode: str) -> dict[str, str]:
        return {"State": "PENDING"}
