"""A job record is matched to the scheduler's job by id *and* submit time (and cluster):
job ids repeat, so a record of the same id from another job is STALE, never another job's
state; requeued attempts of the job still count as its own. Local pids repeat too.

sacct's answers here are given as text in sacct's own format (``SLURM_TIME_FORMAT=%s``);
the real cluster's are in tests/submit/test_slurm_job_identity.py."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest

from hpcrl.run.job_record import JobRecord
from hpcrl.submit import job_state

SUBMITTED = "2026-11-29T10:00:00+00:00"
T0 = int(datetime.datetime.fromisoformat(SUBMITTED).timestamp())
HEADER = "|".join(job_state.SACCT_FIELDS)


def record(**changes: object) -> JobRecord:
    fields: dict = dict(
        executor="slurm", job_id="41", job_name="j", cluster="c", submitit_folder="/x/submitit",
        num_tasks=1, submitted_at=SUBMITTED, max_requeues=1, slurm_cluster="hpcrl",
    )  # fmt: skip
    return JobRecord(**{**fields, **changes})


class Sacct:
    def __init__(self, rows: list[str]) -> None:
        self.rows, self.envs = rows, []

    def __call__(self, command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        self.envs.append(kwargs.get("env"))
        text = HEADER + "\n" + "".join(row + "\n" for row in self.rows)
        return subprocess.CompletedProcess(command, 0, text, "")


def status_of(rec: JobRecord, rows: list[str]) -> job_state.JobStatus:
    sacct = Sacct(rows)
    (status,) = job_state.query_statuses([rec], job_state.SacctWatcher(run=sacct))
    assert sacct.envs[0]["SLURM_TIME_FORMAT"] == "%s"  # epoch seconds: no time zone to guess
    return status


def row(state: str, submit: int, cluster: str = "hpcrl", exit_code: str = "0:0") -> str:
    return f"41|{state}|{exit_code}|10|None|{submit}|{cluster}"


def test_the_rows_of_an_older_job_of_the_same_id_are_not_this_ones() -> None:
    older = row("COMPLETED", T0 - 86_400)  # job 41 of the cluster's life before
    assert status_of(record(), [older, row("RUNNING", T0 + 2)]).state == "RUNNING"
    status = status_of(record(), [older])
    assert status.state == "STALE" and status.is_final
    assert status.stale == (
        "the scheduler's job 41 is another job (submitted 2026-11-28T10:00:00+00:00 on cluster "
        "hpcrl, COMPLETED); this run's job 41 was submitted 2026-11-29T10:00:00+00:00 on hpcrl "
        "and is no longer on record (job ids began again, e.g. after the cluster was "
        "reinstalled)"
    )


def test_a_newer_job_of_the_same_id_does_not_lend_this_run_its_state() -> None:
    # This run's job never ran (the cluster was reset); a new job 41 completed since.
    status = status_of(record(), [row("COMPLETED", T0 + 3 * 86_400)])
    assert (status.state, status.exit_code) == ("STALE", None)


def test_requeued_attempts_count_as_the_job_and_a_later_job_after_its_end_does_not() -> None:
    rows = [row("REQUEUED", T0 + 1), row("PREEMPTED", T0 + 400), row("RUNNING", T0 + 900)]
    status = status_of(record(), rows)
    assert (status.state, status.attempts) == ("RUNNING", 3)
    rows = [row("FAILED", T0 + 1, exit_code="1:0"), row("COMPLETED", T0 + 5000)]
    status = status_of(record(), rows)
    assert (status.state, status.attempts, status.exit_code) == ("FAILED", 1, 1)


def test_a_job_of_another_cluster_is_not_this_one() -> None:
    assert status_of(record(), [row("COMPLETED", T0, cluster="other")]).state == "STALE"
    # No cluster on record (written before hpcrl kept it): the submit time alone decides.
    assert status_of(record(slurm_cluster=None), [row("COMPLETED", T0, "other")]).state == (
        "COMPLETED"
    )


def test_right_after_submission_an_older_row_is_no_news_yet() -> None:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    # sacct lags the controller: the new job 41 is not listed yet, the old one is
    status = status_of(record(submitted_at=now), [row("COMPLETED", T0)])
    assert (status.state, status.stale) == ("UNKNOWN", None)


@pytest.fixture
def fake_controller():
    """A process whose command line reads like submitit's local controller (the check reads
    /proc: cmdline and start time), started now."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "submitit.local._local"]
    )
    time.sleep(0.2)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_reused_pid_is_not_this_local_jobs_controller(fake_controller, tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    local = record(executor="local", job_id=str(fake_controller), slurm_cluster=None,
                   submitit_folder=str(tmp_path / "submitit"), submitted_at=now)  # fmt: skip
    assert job_state.query_status(local).state == "RUNNING"
    # A record from a day ago whose pid now belongs to another controller: not running, and
    # cancelling it must leave that other process alone.
    old = attrs.evolve(local, submitted_at=SUBMITTED)
    assert job_state.query_status(old).state == "FAILED"  # no result of its own, no controller
    job_state.cancel_job(old)
    os.kill(fake_controller, 0)  # still there


def test_a_controller_polled_right_after_submission_is_running(tmp_path: Path) -> None:
    """The kernel ends ``Popen`` before it writes the new argv: a poll in that window reads an
    empty /proc cmdline (CI's sweep once took such a point for FAILED at 0 s)."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    command = [sys.executable, "-c", "import time; time.sleep(60)", "submitit.local._local"]
    # A real just-started controller reads RUNNING (a poll lands in the window only now and
    # then: 41 of 300 immediate /proc reads here); the window itself is checked below.
    for _ in range(10):
        proc = subprocess.Popen(command, start_new_session=True)
        try:
            local = record(executor="local", job_id=str(proc.pid), slurm_cluster=None,
                           submitit_folder=str(tmp_path / "submitit"), submitted_at=now)  # fmt: skip
            assert job_state.query_status(local).state == "RUNNING"
        finally:
            proc.kill()
            proc.wait()
    started = T0 + 1.0
    assert job_state.is_local_controller(b"", "S", started, T0)  # argv not written yet
    assert not job_state.is_local_controller(b"", "Z", started, T0)
    assert not job_state.is_local_controller(b"bash\x00", "S", started, T0)
    assert not job_state.is_local_controller(b"", "S", T0 + 86_400.0, T0)  # another process


def _sweep(tmp_path: Path, states: tuple[str, ...], submit: int) -> tuple[Path, Sacct]:
    """A sweep folder of array 41 with one point per state; sacct answers its tasks' rows."""
    from hpcrl.run.job_record import write_job_record
    from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
    from hpcrl.submit.sweep import build_points

    sweep_dir = tmp_path / "s"
    sweep_dir.mkdir()
    values = ",".join(str(index) for index in range(len(states)))
    points = tuple(build_points([f"grpo.seed={values}"]))
    write_sweep_record(sweep_dir, SweepRecord(
        name="s", recipe_source="r", cluster="c", overrides=(), swept_keys=("grpo.seed",),
        points=points, array_job_id="41", submitted_at=SUBMITTED,
    ))  # fmt: skip
    for point in points:
        (sweep_dir / point.run_dir_name).mkdir()
        write_job_record(sweep_dir / point.run_dir_name,
                         record(job_id=f"41_{point.index}", array_index=point.index))  # fmt: skip
    rows = [f"41_{index}|{state}|0:0|10|None|{submit}|hpcrl" for index, state in enumerate(states)]
    return sweep_dir, Sacct(rows)


@pytest.mark.parametrize(
    ("states", "submit", "said"),
    [
        (("RUNNING", "COMPLETED"), T0 + 2, "Cancelled job array 41 (2 points) of {sweep}"),
        (("COMPLETED", "FAILED"), T0 + 2,
         "Job array 41 of {sweep} already ended (1 COMPLETED, 1 FAILED); nothing to cancel"),
        # the cluster began its ids again: array 41 is another job, running now
        (("RUNNING", "RUNNING"), T0 + 3 * 86_400,
         "Not cancelling job array 41 of {sweep}: the scheduler's job 41_0 is another job "
         "(submitted 2026-12-02T10:00:00+00:00 on cluster hpcrl, RUNNING); this run's job 41_0 "
         "was submitted 2026-11-29T10:00:00+00:00 on hpcrl and is no longer on record (job ids "
         "began again, e.g. after the cluster was reinstalled)"),
    ],
)  # fmt: skip
def test_cancel_sweep_scancels_the_array_only_while_it_is_the_sweeps_own_and_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states: tuple, submit: int, said: str
) -> None:
    import io

    from rich.console import Console

    from hpcrl.submit import cancel

    sweep_dir, sacct = _sweep(tmp_path, states, submit)
    cancelled: list[str] = []
    monkeypatch.setattr(cancel, "cancel_job", lambda rec: cancelled.append(rec.job_id))
    console = Console(file=io.StringIO(), width=500)
    watcher = job_state.SacctWatcher(run=sacct)
    assert cancel.cancel_run(sweep_dir, console, watcher) == 0
    assert console.file.getvalue() == said.format(sweep=sweep_dir) + "\n"  # one line
    assert cancelled == (["41"] if said.startswith("Cancelled") else [])
