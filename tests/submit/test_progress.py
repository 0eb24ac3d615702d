"""``--wait`` after ``hpcrl resume`` (issue 26 item 6): the progress line shows the new
attempt's phase (starting Ray, loading the checkpoint of step N, ...) and, once it trains,
its own steps with an ETA; at 167264e it showed the old attempt's last step for ~75 s. The
scheduler's answers are JobStatus values; the run folder's files are real."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpcrl.core.phase import ATTEMPT_ID_VARIABLE, report_phase
from hpcrl.run.job_record import JobRecord
from hpcrl.submit.job_identity import record_time
from hpcrl.submit.job_status import JobStatus
from hpcrl.submit.waiting import describe_progress

RUNNING = JobStatus(state="RUNNING")


def _record(**changes: object) -> JobRecord:
    fields = dict(
        executor="slurm", job_id="57", job_name="j", cluster="c", submitit_folder="/nowhere",
        num_tasks=1, submitted_at="2026-11-29T10:00:00+00:00", max_requeues=0,
        attempt_offset=1, earlier_job_ids=("41",),
    )  # fmt: skip
    return JobRecord(**{**fields, **changes})


def _marker(run: Path, name: str, **fields: object) -> None:
    (run / "status").mkdir(exist_ok=True)
    (run / "status" / name).write_text(json.dumps(fields))


def _metrics(run: Path, steps: range, time_step_s: float = 2.0) -> None:
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward_mean": s / 100, "time_step_s": time_step_s}) + "\n"
        for s in steps
    ))  # fmt: skip


@pytest.fixture
def resumed(tmp_path: Path) -> Path:
    """What job 41 left: 10 steps, its markers; a checkpoint of step 8."""
    _metrics(tmp_path, range(1, 11))
    _marker(tmp_path, "ray_ready", attempt="41.0", time=time.time() - 600)
    _marker(tmp_path, "phase", attempt="41.0", time=time.time() - 590, phase="training from step 1",
            first_step=1)  # fmt: skip
    return tmp_path


def test_a_resumed_run_shows_its_new_attempts_phases_then_its_own_steps(resumed: Path):
    record = _record()
    assert describe_progress(resumed, RUNNING, 20, record) == "running, starting Ray"
    _marker(resumed, "ray_ready", attempt="57.0", time=time.time() + 5)
    assert describe_progress(resumed, RUNNING, 20, record) == "Ray ready, driver starting"
    _marker(resumed, "phase", attempt="57.0", time=time.time(),
            phase="loading the checkpoint of step 8")  # fmt: skip
    assert describe_progress(resumed, RUNNING, 20, record) == "loading the checkpoint of step 8"
    _metrics(resumed, range(1, 9))  # the driver drops the lines of steps after its checkpoint
    _marker(resumed, "phase", attempt="57.0", time=time.time(), phase="training from step 9",
            first_step=9)  # fmt: skip
    assert describe_progress(resumed, RUNNING, 20, record) == "training from step 9"
    _metrics(resumed, range(1, 10), time_step_s=3.0)  # step 9 again
    assert (
        describe_progress(resumed, RUNNING, 20, record)
        == "training step 9/20 · reward 0.09 · ETA 33s"  # 11 steps left at 3 s
    )


def test_a_requeued_attempt_does_not_take_the_previous_attempts_markers(resumed: Path):
    record = _record(job_id="41", attempt_offset=0, earlier_job_ids=())
    second = JobStatus(state="RUNNING", attempts=2)
    assert describe_progress(resumed, second, 20, record) == "running, starting Ray (attempt 2)"
    assert (
        describe_progress(resumed, RUNNING, 20, record)
        == "training step 10/20 · reward 0.1 · ETA 20s"
    )


def test_an_array_tasks_markers_count_from_its_submission(tmp_path: Path):
    """An array task's markers name Slurm's own id of the task (not ``41_1``): one written
    before the task's record was submitted is an earlier job's."""
    record = _record(job_id="41_1", array_index=1, attempt_offset=0, earlier_job_ids=())
    _marker(tmp_path, "ray_ready", attempt="43.0", time=record_time(record) - 3600)
    assert describe_progress(tmp_path, RUNNING, 20, record) == "running, starting Ray"
    _marker(tmp_path, "ray_ready", attempt="43.0", time=record_time(record) + 30)
    assert describe_progress(tmp_path, RUNNING, 20, record) == "Ray ready, driver starting"


def test_the_driver_writes_its_phase_only_inside_a_job(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(ATTEMPT_ID_VARIABLE, raising=False)
    report_phase(tmp_path, "starting 2 workers")
    assert not (tmp_path / "status").exists()  # `python -m hpcrl.core.driver RUN` by hand
    monkeypatch.setenv(ATTEMPT_ID_VARIABLE, "57.0")
    report_phase(tmp_path, "training from step 9", first_step=9)
    marker = json.loads((tmp_path / "status" / "phase").read_text())
    assert {key: marker[key] for key in ("attempt", "phase", "first_step")} == {
        "attempt": "57.0", "phase": "training from step 9", "first_step": 9
    }  # fmt: skip
    assert abs(marker["time"] - time.time()) < 60
    assert os.listdir(tmp_path / "status") == ["phase"]  # no temporary file left
