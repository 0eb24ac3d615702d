"""``hpcrl logs``: each line once, one prefix style with and without -f, attempts, sweeps,
the driver alone (real files laid out as a job leaves them; no cluster)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from hpcrl.config.errors import UserError
from hpcrl.job.errors import DriverFailed, PreflightFailed
from hpcrl.job.node_task import one_line_for_explained_failures
from hpcrl.job.slurm_env import banner_of as attempt_banner
from hpcrl.job.slurm_env import shown_job_id as job_id_of
from hpcrl.run.job_record import JobRecord, write_job_record
from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
from hpcrl.submit import log_view
from hpcrl.submit.log_view import LoggedRun, LogSelection
from hpcrl.submit.sweep import build_points

BANNER_1 = "===== hpcrl attempt 1 · job 41 · node 0 (n1) · 2026-11-29T10:00:00+00:00 =====\n"
BANNER_2 = "===== hpcrl attempt 2 · job 41 · node 0 (n1) · 2026-11-29T10:05:00+00:00 =====\n"
NODE_LINE_1 = "2026-11-29 10:00:01.000 node0 INFO node 0 of 1\n"
NODE_LINE_2 = "2026-11-29 10:05:01.000 node0 INFO node 0 of 1\n"
#: submitit's logger writes WARNING and up to both stdout and stderr (submitit/core/logger.py)
SUBMITIT_ERROR = "submitit ERROR (2026-11-29 10:05:09,883) - Submitted job triggered an exception\n"


def _record(run_dir: Path, job_id: str = "41") -> JobRecord:
    return JobRecord(
        executor="slurm", job_id=job_id, job_name="j", cluster="c",
        submitit_folder=str(run_dir / "submitit"), num_tasks=1,
        submitted_at="2026-11-29T10:00:00+00:00", max_requeues=1,
    )  # fmt: skip


def make_run(run_dir: Path, job_id: str = "41") -> Path:
    """A one-node job that was requeued once: submitit's appended files with both banners,
    node.log (its lines are in stderr too) and driver.log per attempt, Ray's coloured out."""
    (run_dir / "submitit").mkdir(parents=True)
    write_job_record(run_dir, _record(run_dir, job_id))
    (run_dir / "submitit" / f"{job_id}_0_log.out").write_text(
        f"{BANNER_1}submitit INFO starting\n{BANNER_2}submitit INFO starting again\n"
        f"{SUBMITIT_ERROR}"
    )
    (run_dir / "submitit" / f"{job_id}_0_log.err").write_text(
        f"{BANNER_1}{NODE_LINE_1}{BANNER_2}{NODE_LINE_2}{SUBMITIT_ERROR}"
        "hpcrl: job failed: driver d exited with code 7\n"
    )
    for attempt, node_line in ((0, NODE_LINE_1), (1, NODE_LINE_2)):
        folder = run_dir / "logs" / "node0" / f"attempt{attempt}"
        folder.mkdir(parents=True)
        (folder / "node.log").write_text(node_line)
        (folder / "driver.log").write_text(f"driver step {attempt + 1}\n")
        (folder / "ray.out").write_text("\x1b[32mRay runtime started.\x1b[39m\n")
    return run_dir


def _shown(runs: list[LoggedRun], selection: LogSelection | None = None) -> str:
    stream = io.StringIO()
    log_view.print_logs(runs, selection or LogSelection(), stream)
    return stream.getvalue()


def test_every_line_once_with_one_prefix_and_no_colour_codes(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    runs = log_view.runs_to_show(run, point=None)
    assert _shown(runs) == (
        "[node0 stdout] submitit INFO starting\n"
        "[node0 stdout] submitit INFO starting again\n"
        f"[node0 stderr] {BANNER_1}"
        f"[node0 stderr] {NODE_LINE_1}"
        f"[node0 stderr] {BANNER_2}"
        f"[node0 stderr] {NODE_LINE_2}"
        f"[node0 stderr] {SUBMITIT_ERROR}"  # once: from stderr, not stdout too
        "[node0 stderr] hpcrl: job failed: driver d exited with code 7\n"
        "[node0 attempt1 driver.log] driver step 1\n"
        "[node0 attempt1 ray.out] Ray runtime started.\n"
        "[node0 attempt2 driver.log] driver step 2\n"
        "[node0 attempt2 ray.out] Ray runtime started.\n"
    )


def test_follow_prints_the_same_lines_as_without_it(tmp_path: Path) -> None:
    runs = log_view.runs_to_show(make_run(tmp_path / "run"), point=None)
    for selection in (LogSelection(), LogSelection(attempt=2), LogSelection(driver_only=True)):
        followed = io.StringIO()
        log_view.follow_logs(runs, selection, lambda: True, 0.01, followed)
        assert sorted(followed.getvalue().splitlines()) == sorted(
            _shown(runs, selection).splitlines()
        )


def test_one_attempt_the_driver_alone_and_a_missing_attempt(tmp_path: Path) -> None:
    runs = log_view.runs_to_show(make_run(tmp_path / "run"), point=None)
    assert _shown(runs, LogSelection(attempt=2)) == (
        "[node0 stdout] submitit INFO starting again\n"
        f"[node0 stderr] {BANNER_2}"
        f"[node0 stderr] {NODE_LINE_2}"
        f"[node0 stderr] {SUBMITIT_ERROR}"
        "[node0 stderr] hpcrl: job failed: driver d exited with code 7\n"
        "[node0 attempt2 driver.log] driver step 2\n"
        "[node0 attempt2 ray.out] Ray runtime started.\n"
    )
    assert _shown(runs, LogSelection(driver_only=True)) == (
        "[node0 attempt1 driver.log] driver step 1\n[node0 attempt2 driver.log] driver step 2\n"
    )
    with pytest.raises(UserError) as raised:
        log_view.check_attempt(runs, LogSelection(attempt=3))
    assert raised.value.one_line() == (
        "--attempt 3: job 41 has attempts 1..2 (fix: give --attempt 1..2, or leave --attempt "
        "out for all)"
    )
    log_view.check_attempt(runs, LogSelection(attempt=2))  # there: no error


def test_node_log_is_shown_when_the_task_left_no_stderr(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    (run / "submitit" / "41_0_log.err").unlink()
    shown = _shown(log_view.runs_to_show(run, None), LogSelection(attempt=1))
    assert f"[node0 attempt1 node.log] {NODE_LINE_1}" in shown


def test_a_sweep_shows_every_point_or_one(tmp_path: Path) -> None:
    sweep = tmp_path / "sw"
    sweep.mkdir()
    points = tuple(build_points(["grpo.seed=1,2"]))
    write_sweep_record(sweep, SweepRecord(name="sw", recipe_source="r", cluster="c",
                                          overrides=(), swept_keys=("grpo.seed",), points=points))  # fmt: skip
    for index in (0, 1):
        make_run(sweep / f"point-{index}", job_id=f"20_{index}")
    driver = LogSelection(driver_only=True, attempt=1)
    assert _shown(log_view.runs_to_show(sweep, None), driver) == (
        "[point-0 node0 attempt1 driver.log] driver step 1\n"
        "[point-1 node0 attempt1 driver.log] driver step 1\n"
    )
    assert _shown(log_view.runs_to_show(sweep, 1), driver) == (
        "[point-1 node0 attempt1 driver.log] driver step 1\n"
    )
    with pytest.raises(UserError, match=r"--point 5: the sweep sw has points 0\.\.1"):
        log_view.runs_to_show(sweep, 5)
    with pytest.raises(UserError, match="is not a sweep folder"):
        log_view.runs_to_show(sweep / "point-0", 0)


def test_a_task_ends_an_explained_failure_with_one_line(capsys: pytest.CaptureFixture) -> None:
    fallback_calls, exits = [], []
    hook = one_line_for_explained_failures(
        lambda *args: fallback_calls.append(args), exit_with=exits.append
    )
    failed = DriverFailed(7, "pkg:drive", "Traceback (most recent call last):\n  ...\nValueError",
                          log_path="/r/logs/node0/attempt0/driver.log")  # fmt: skip
    hook(DriverFailed, failed, None)
    hook(PreflightFailed, PreflightFailed("ray is missing\nsecond line"), None)
    assert capsys.readouterr().err == (
        "hpcrl: job failed: driver pkg:drive exited with code 7 (its log: "
        "/r/logs/node0/attempt0/driver.log)\nhpcrl: job failed: ray is missing\n"
    )
    # the driver's exit code becomes the task's (Python's 1 stays for the rest); submitit's
    # local requeue code is never one
    for code in (1, 137, 144, 255):
        hook(DriverFailed, DriverFailed(code, "pkg:drive", ""), None)
    capsys.readouterr()
    assert exits == [7, 137, 1, 255]
    error = ValueError("a bug")
    hook(ValueError, error, None)  # not explained: the full stack, as Python prints it
    assert fallback_calls == [(ValueError, error, None)]
    assert sys.excepthook is not hook


def test_array_tasks_are_named_by_array_and_index() -> None:
    array_env = {"SLURM_JOB_ID": "23", "SLURM_ARRAY_JOB_ID": "20", "SLURM_ARRAY_TASK_ID": "3"}
    assert job_id_of(array_env) == "20_3"
    assert job_id_of({"SLURM_JOB_ID": "23"}) == "23"
    assert attempt_banner(array_env).startswith("===== hpcrl attempt 1 · job 20_3 · node 0 (")


def test_a_failure_shows_each_nodes_stderr_and_driver_tail_once(tmp_path: Path) -> None:
    from rich.console import Console

    from hpcrl.submit.waiting import print_log_tails

    run = make_run(tmp_path / "run")
    console = Console(file=io.StringIO(), width=200)
    print_log_tails(run, _record(run), console)
    assert console.file.getvalue() == (
        f"[node0 stderr] {BANNER_1}"
        f"[node0 stderr] {NODE_LINE_1}"
        f"[node0 stderr] {BANNER_2}"
        f"[node0 stderr] {NODE_LINE_2}"
        f"[node0 stderr] {SUBMITIT_ERROR}"
        "[node0 stderr] hpcrl: job failed: driver d exited with code 7\n"
        "[node0 attempt1 driver.log] driver step 1\n"
        "[node0 attempt2 driver.log] driver step 2\n"
    )


def test_secrets_a_job_printed_are_hidden_in_every_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``logs``, ``logs -f`` and ``--wait``'s tails show what a job printed with the values of
    this shell's secret-named variables and token shapes hidden, as error messages do."""
    from rich.console import Console

    from hpcrl.submit.waiting import print_log_tails

    plain, token = "correct-horse-battery", "hf_" + "S3cr3t" * 6
    monkeypatch.setenv("DB_PASSWORD", plain)
    run = make_run(tmp_path / "run")
    with (run / "submitit" / "41_0_log.err").open("a") as stream:
        stream.write(f"env: DB_PASSWORD={plain} HF_TOKEN={token}\n")
    with (run / "logs" / "node0" / "attempt1" / "driver.log").open("a") as stream:
        stream.write(f"login with {token}\n")
    runs = log_view.runs_to_show(run, point=None)
    followed = io.StringIO()
    log_view.follow_logs(runs, LogSelection(), lambda: True, 0.01, followed)
    console = Console(file=io.StringIO(), width=200)
    print_log_tails(run, _record(run), console)
    for shown in (_shown(runs), followed.getvalue(), console.file.getvalue()):
        assert plain not in shown and token not in shown
        assert (
            "[node0 stderr] env: DB_PASSWORD=<value of $DB_PASSWORD hidden> HF_TOKEN=<a " in shown
        )
        assert "[node0 attempt2 driver.log] login with <a Hugging Face token hidden>" in shown
