"""When ``hpcrl submit --wait`` stops waiting, and what the progress line says (no cluster:
the scheduler's answers are given as JobStatus values; submitit's files are real files)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from pathlib import Path

import attrs
import pytest
from rich.console import Console

from hpcrl.job.slurm_env import banner_of as attempt_banner
from hpcrl.run.job_record import JobRecord
from hpcrl.submit import waiting
from hpcrl.submit.job_identity import record_time
from hpcrl.submit.job_status import JobStatus
from hpcrl.submit.logs import split_attempts


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


#: attempt 2 of a requeued job, started at this epoch second (sacct's Start)
_SECOND_ATTEMPT = JobStatus(state="RUNNING", attempts=2, started_at_s=2_000_000_000.0)


@pytest.mark.parametrize(
    ("statuses", "results_at_s", "final_state"),
    [
        ([JobStatus(state="RUNNING"), JobStatus(state="COMPLETED")], None, "COMPLETED"),
        ([JobStatus(state="RUNNING")] * 50, time.time(), "ENDED"),  # sacct lags or is down
        ([JobStatus(state="UNKNOWN")] * 50, None, "LOST"),
        ([JobStatus(state="RUNNING", scheduler_error="sacct exited 1")] * 50, None, "UNREACHABLE"),
        # CI, 2026-12-07: a requeue read as failed left every task's result of attempt 1
        # while attempt 2 ran: they end nothing; attempt 2's own results do
        ([JobStatus(state="PENDING", attempts=2), *[_SECOND_ATTEMPT] * 50,
          attrs.evolve(_SECOND_ATTEMPT, state="COMPLETED")], 1_999_999_990.0, "COMPLETED"),
        ([_SECOND_ATTEMPT] * 50, 2_000_000_100.0, "ENDED"),
    ],
)  # fmt: skip
def test_waiting_always_ends(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    statuses: list,
    results_at_s: float | None,
    final_state: str,
) -> None:
    record = _record(tmp_path)
    if results_at_s is not None:
        (tmp_path / "submitit").mkdir()
        for task in range(record.num_tasks):
            result = tmp_path / "submitit" / f"41_{task}_result.pkl"
            result.write_bytes(b"")
            os.utime(result, (results_at_s, results_at_s))
    answers = iter(statuses)
    monkeypatch.setattr(waiting, "query_statuses", lambda records, *_: [next(answers)])
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
    first = {
        "RUNNING": "job 41: running, starting Ray",
        "UNKNOWN": "job 41: queued",
        "PENDING": "job 41: queued",
    }[statuses[0].state]
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


def test_long_wait_prints_each_phase_steps_and_heartbeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polls every 10 s: 30 s pending on Priority, 20 s on Resources, then running; Ray ready
    at 80 s, steps 1..12 from 160 s (one per poll), completed at 280 s. Heartbeat 60 s, a
    step line at most every 30 s."""
    clock = _FakeClock()
    metrics = tmp_path / "metrics.jsonl"

    def status_now(_records: list[JobRecord], *_: object) -> list[JobStatus]:
        return [_status_at(clock.now_s - 1000.0)]

    def _status_at(t: float) -> JobStatus:
        if t < 30:
            return JobStatus(state="PENDING", reason="Priority")
        if t < 50:
            return JobStatus(state="PENDING", reason="Resources")
        if t >= 80:
            (tmp_path / "status").mkdir(exist_ok=True)
            (tmp_path / "status" / "ray_ready").write_text(json.dumps({"attempt": "41.0"}))
        if t >= 160:
            step = int(t - 160) // 10 + 1
            metrics.write_text(json.dumps({"step": step, "reward_mean": step / 100}) + "\n")
        return JobStatus(state="COMPLETED" if t >= 280 else "RUNNING")

    monkeypatch.setattr(waiting, "query_statuses", status_now)
    monkeypatch.setattr(waiting, "read_outcome", lambda *args: _Outcome())
    monkeypatch.setattr(waiting, "report_outcome", lambda *args: None)
    console = _quiet_console()
    settings = waiting.WaitSettings(poll_s=10.0, heartbeat_s=60.0, step_line_s=30.0)

    waiting.wait_for_job(
        tmp_path, _record(tmp_path), console, 12, settings, clock=clock, sleep=clock.sleep
    )

    assert console.file.getvalue().splitlines() == [
        "[     0s] job 41: queued (reason: Priority)",
        "[    30s] job 41: queued (reason: Resources)",
        "[    50s] job 41: running, starting Ray",
        "[  1m20s] job 41: Ray ready, driver starting",
        "[  2m20s] job 41: still Ray ready, driver starting (for 1m00s)",  # a heartbeat
        "[  2m40s] job 41: training step 1/12 · reward 0.01",
        "[  3m10s] job 41: training step 4/12 · reward 0.04",
        "[  3m40s] job 41: training step 7/12 · reward 0.07",
        "[  4m10s] job 41: training step 10/12 · reward 0.1",
        "[  4m40s] job 41: completed",
    ]
    # with a line per step allowed on every poll, each step has its line
    clock.now_s = 1000.0
    metrics.unlink()
    (tmp_path / "status" / "ray_ready").unlink()
    console = _quiet_console()
    settings = waiting.WaitSettings(poll_s=10.0, heartbeat_s=600.0, step_line_s=10.0)
    waiting.wait_for_job(
        tmp_path, _record(tmp_path), console, 12, settings, clock=clock, sleep=clock.sleep
    )
    steps = [line for line in console.file.getvalue().splitlines() if "training step" in line]
    assert [line.split("step ")[1].split("/")[0] for line in steps] == [
        str(s) for s in range(1, 13)
    ]


class _Sacct:
    """Answers like sacct for the jobs asked about; counts the calls."""

    def __init__(
        self,
        rows: list[str],
        returncode: int = 0,
        fields: str = "JobID|State|ExitCode|ElapsedRaw|Reason",
    ) -> None:
        self.rows, self.returncode, self.commands, self.fields = rows, returncode, [], fields

    def __call__(self, command: list[str], **_: object) -> subprocess.CompletedProcess:
        if command[0] == "squeue":  # asked while a job is pending; knows nothing here
            return subprocess.CompletedProcess(command, 0, "", "")
        self.commands.append(command)
        text = self.fields + "\n" + "".join(r + "\n" for r in self.rows)
        return subprocess.CompletedProcess(command, self.returncode, text, "sacct: down\n")


def test_sacct_start_dates_the_current_attempt() -> None:
    from hpcrl.submit import job_state

    assert "Start" in job_state.SACCT_FIELDS
    sacct = _Sacct(["41|REQUEUED|0:0|9|1999999000", "41|RUNNING|0:0|3|2000000000"],
                   fields="JobID|State|ExitCode|ElapsedRaw|Start")  # fmt: skip
    (status,) = job_state.query_statuses([_record(Path("/x"))], job_state.SacctWatcher(run=sacct))
    assert (status.state, status.attempts, status.started_at_s) == ("RUNNING", 2, 2e9)
    sacct.rows = ["41|PENDING|0:0|0|Unknown"]  # a pending attempt has no start yet
    (status,) = job_state.query_statuses([_record(Path("/x"))], job_state.SacctWatcher(run=sacct))
    assert status.started_at_s is None


def test_sacct_pending_reason_reaches_the_status() -> None:
    from hpcrl.submit import job_state

    sacct = _Sacct(["41|PENDING|0:0|0|Priority"])
    status = job_state.query_statuses([_record(Path("/x"))], job_state.SacctWatcher(run=sacct))[0]
    assert (status.state, status.reason) == ("PENDING", "Priority")
    sacct.rows = ["41|RUNNING|0:0|3|None"]
    assert (
        job_state.query_statuses([_record(Path("/x"))], job_state.SacctWatcher(run=sacct))[0].reason
        is None
    )


def test_one_sacct_call_answers_for_every_job_arrays_and_attempts_included() -> None:
    from hpcrl.submit import job_state

    records = [
        attrs.evolve(_record(Path("/x")), job_id=job_id)
        for job_id in ("41", "50_0", "50_1", "50_2")
    ]
    sacct = _Sacct([
        "41|PREEMPTED|0:0|30|None", "41|RUNNING|0:0|5|None",  # requeued once: two rows
        "50_0|COMPLETED|0:0|12|None", "50_1|FAILED|1:0|9|None", "50_[2-3%2]|PENDING|0:0|0|JobArrayTaskLimit",
    ])  # fmt: skip
    watcher = job_state.SacctWatcher(run=sacct)
    statuses = job_state.query_statuses(records, watcher)
    assert [(s.state, s.attempts, s.exit_code) for s in statuses] == [
        ("RUNNING", 2, None), ("COMPLETED", 1, 0), ("FAILED", 1, 1), ("PENDING", 1, None)
    ]  # fmt: skip
    assert statuses[3].reason == "JobArrayTaskLimit"
    assert len(sacct.commands) == 1
    assert sacct.commands[0][-4:] == ["-j", "41", "-j", "50"]
    # Without force, the next call waits for submitit's backoff; ended jobs are not asked again.
    job_state.query_statuses(records, watcher, force=False)
    assert len(sacct.commands) == 1
    sacct.rows[-1] = "50_2|COMPLETED|0:0|3|None"
    for _ in range(2):
        time.sleep(0.01)  # submitit ignores a forced call within 1 ms of the last
        job_state.query_statuses(records, watcher, force=True)
    assert sacct.commands[1][-4:] == ["-j", "41", "-j", "50"]  # 50_2 was still pending
    assert sacct.commands[2][-2:] == ["-j", "41"] and "50" not in sacct.commands[2]


def test_a_failing_or_missing_sacct_is_kept_as_the_reason_not_raised() -> None:
    from hpcrl.submit import job_state

    failing = job_state.SacctWatcher(run=_Sacct([], returncode=1))
    status = job_state.query_statuses([_record(Path("/x"))], failing)[0]
    assert (status.state, status.scheduler_error) == ("UNKNOWN", "sacct exited 1: sacct: down")

    def missing(command: list[str], **_: object) -> subprocess.CompletedProcess:
        raise FileNotFoundError(2, "No such file or directory", "sacct")

    status = job_state.query_statuses([_record(Path("/x"))], job_state.SacctWatcher(run=missing))[0]
    assert status.scheduler_error == "sacct: [Errno 2] No such file or directory: 'sacct'"


def test_a_sweep_is_waited_for_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three points, one scheduler query per poll for all, one line per change of any."""
    clock = _FakeClock()
    calls: list[list[str]] = []
    ends = {"41_0": 20, "41_1": 40, "41_2": 30}

    def statuses(records: list[JobRecord], *_: object) -> list[JobStatus]:
        calls.append([record.job_id for record in records])
        t = clock.now_s - 1000.0
        return [JobStatus(state="COMPLETED" if t >= ends[r.job_id] else "RUNNING") for r in records]

    monkeypatch.setattr(waiting, "query_statuses", statuses)
    monkeypatch.setattr(waiting, "read_outcome", lambda *args: _Outcome())
    monkeypatch.setattr(waiting, "report_outcome", lambda *args: None)
    runs = [
        (tmp_path / f"point-{i}", attrs.evolve(_record(tmp_path), job_id=f"41_{i}"))
        for i in range(3)
    ]
    console = _quiet_console()
    settings = waiting.WaitSettings(poll_s=10.0, heartbeat_s=600.0)
    outcomes = waiting.wait_for_jobs(runs, console, 12, settings, clock=clock, sleep=clock.sleep)
    assert len(outcomes) == 3
    assert calls == [["41_0", "41_1", "41_2"]] * 3 + [["41_1", "41_2"]] + [["41_1"]]
    assert console.file.getvalue().splitlines() == [
        "[     0s] 3 jobs: 0/3 done · 3 running",
        "[    20s] 3 jobs: 1/3 done · 1 completed, 2 running",
        "[    30s] 3 jobs: 2/3 done · 2 completed, 1 running",
        "[    40s] 3 jobs: 3/3 done · 3 completed",
    ]


def test_a_sweeps_line_shows_each_training_points_step_of_its_own_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two points with different grpo.max_num_steps (read from each point's resolved recipe):
    the sweep's one line carries each training point's N/M; a queued point adds nothing."""
    clock = _FakeClock()
    runs = []
    for index, max_steps in enumerate((4, 6, 4)):
        run_dir = tmp_path / f"point-{index}"
        run_dir.mkdir()
        (run_dir / "recipe.resolved.yaml").write_text(f"grpo:\n  max_num_steps: {max_steps}\n")
        record = attrs.evolve(_record(tmp_path), job_id=f"41_{index}", array_index=index)
        runs.append((run_dir, record))
        # each task's Ray is ready (an array task's marker names Slurm's own id of the task)
        (run_dir / "status").mkdir()
        ready = {"attempt": f"{42 + index}.0", "time": record_time(record) + 5}
        (run_dir / "status" / "ray_ready").write_text(json.dumps(ready))
    steps_at = {0: {"point-0": 1, "point-1": 2}, 10: {"point-0": 3, "point-1": 5}}

    def statuses(records: list[JobRecord], *_: object) -> list[JobStatus]:
        t = clock.now_s - 1000.0
        for name, step in steps_at.get(int(t), {}).items():
            lines = "".join(f'{{"step": {s}, "loss": 0.5}}\n' for s in range(1, step + 1))
            (tmp_path / name / "metrics.jsonl").write_text(lines)
        state = {"41_0": "RUNNING", "41_1": "RUNNING", "41_2": "PENDING"}
        if t >= 20:
            state = dict.fromkeys(state, "COMPLETED")
        return [JobStatus(state=state[record.job_id]) for record in records]

    monkeypatch.setattr(waiting, "query_statuses", statuses)
    monkeypatch.setattr(waiting, "read_outcome", lambda *args: _Outcome())
    monkeypatch.setattr(waiting, "report_outcome", lambda *args: None)
    console = _quiet_console()
    settings = waiting.WaitSettings(poll_s=10.0, heartbeat_s=600.0, step_line_s=10.0)
    waiting.wait_for_jobs(runs, console, None, settings, clock=clock, sleep=clock.sleep)
    assert console.file.getvalue().splitlines() == [
        "[     0s] 3 jobs: 0/3 done · 2 training, 1 queued · point-0 1/4, point-1 2/6",
        "[    10s] 3 jobs: 0/3 done · 2 training, 1 queued · point-0 3/4, point-1 5/6",
        "[    20s] 3 jobs: 3/3 done · 3 completed",
    ]


def test_ctrl_c_detaches_saying_how_to_follow_and_cancels_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "r"
    monkeypatch.setattr(waiting, "query_statuses", lambda records, *_: [JobStatus(state="RUNNING")])

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    console = _quiet_console()
    outcome = waiting.wait_for_job(run_dir, _record(tmp_path), console, settings=_fast(),
                                   sleep=interrupted)  # fmt: skip
    assert outcome.exit_code == waiting.DETACHED_EXIT_CODE == 130
    assert console.file.getvalue().splitlines()[-1] == (
        "detached: job 41 is still running; follow with: hpcrl logs runs/r -f (or hpcrl status "
        "runs/r)"
    )


def test_the_final_line_repeats_the_last_step_reward_and_loss(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 11, "reward_mean": 0.4, "loss": 0.5}\n{"step": 12, "reward_mean": 0.5, "loss": 0.25}\n'
    )
    console = _quiet_console()
    done = waiting.JobOutcome(exit_code=0, has_result=True)
    status = JobStatus(state="COMPLETED", exit_code=0)
    waiting.report_outcome(tmp_path, _record(tmp_path), status, done, console, 12)
    assert console.file.getvalue() == (
        "done: job 41 COMPLETED, exit code 0 · step 12/12 · reward 0.5 · loss 0.25\n"
    )


def test_a_resumed_runs_job_numbers_its_attempts_after_the_earlier_jobs() -> None:
    from hpcrl.job.slurm_env import read_slurm_task

    env = {"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "77", "SLURM_NODEID": "0"}
    banner = attempt_banner(env, attempt_offset=2)  # the run's jobs before made 2 attempts
    assert banner.startswith("===== hpcrl attempt 4 · job 77 · node 0 (")
    # submitit's own start lines come before the first banner: they are that attempt's
    parts = split_attempts(f"submitit INFO starting\n{banner}\nstep 5\n")
    assert list(parts) == [4] and parts[4].startswith("submitit INFO starting\n")
    task = read_slurm_task(
        {**env, "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1", "HPCRL_ATTEMPT_OFFSET": "2"}
    )
    # logs/node0/attempt3/ (the run's 4th attempt); markers stay keyed by this job's attempt
    assert (task.run_attempt, task.attempt_id) == (3, "77.1")
    assert read_slurm_task({"SUBMITIT_LOCAL_JOB_ID": "9"}, requeue_count=0).run_attempt == 0


def test_a_job_slurm_requeued_after_node_fail_waits_on_and_is_not_final() -> None:
    """sacct shows the NODE_FAIL attempt alone until the requeued job is eligible again; the
    controller's queue still has it, so the job is PENDING in its next attempt, not over."""
    from hpcrl.submit import job_state

    class Queue(_Sacct):
        def __call__(self, command: list[str], **_: object) -> subprocess.CompletedProcess:
            if command[0] == "squeue":
                text = "41|PENDING\n" if "--format=%i|%T" in command else "41|BeginTime\n"
                return subprocess.CompletedProcess(command, 0, text if self.queued else "", "")
            return super().__call__(command)

    sacct = Queue(["41|REQUEUED|0:0|9|None", "41|NODE_FAIL|0:0|30|None"])
    sacct.queued = True
    watcher = job_state.SacctWatcher(run=sacct)
    (status,) = job_state.query_statuses([_record(Path("/x"))], watcher)
    assert (status.state, status.attempts, status.reason, status.is_final) == (
        "PENDING", 3, "BeginTime", False,
    )  # fmt: skip
    assert status.states == ("REQUEUED", "NODE_FAIL", "PENDING")
    sacct.queued = False  # Slurm did not requeue it: the job ended NODE_FAIL
    watcher = job_state.SacctWatcher(run=sacct)
    (status,) = job_state.query_statuses([_record(Path("/x"))], watcher)
    assert (status.state, status.attempts, status.is_final) == ("NODE_FAIL", 2, True)
