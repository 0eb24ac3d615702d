"""status / logs / cancel / sweep on everyday mistakes: one clear line, a non-zero exit, no
hang (no cluster: sacct and scancel are stand-in scripts on PATH, see tests/robust/harness.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from hpcrl.run.jobspec_file import read_jobspec
from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
from hpcrl.submit import waiting
from hpcrl.submit.sweep import build_points
from tests.plan.planning_inputs import isolate_from_user_profiles
from tests.robust.harness import write_scheduler_standins


def record(run: Path, **changes: object) -> dict:
    data = {
        "executor": "slurm", "job_id": "4242", "job_name": "j", "cluster": "c",
        "submitit_folder": str(run / "submitit"), "num_tasks": 2,
        "submitted_at": "2026-11-29T10:00:00+00:00", "max_requeues": 0, "schema": 1,
    }  # fmt: skip
    return {**data, **changes}


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*argv: str, sacct: str = "empty") -> tuple[int, str, str]:
        bin_dir = write_scheduler_standins(tmp_path / f"bin-{sacct}", sacct)
        path = str(bin_dir) if sacct == "missing" else f"{bin_dir}:/usr/bin:/bin"
        monkeypatch.setenv("PATH", path)
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def make_run(folder: Path, content: object) -> Path:
    folder.mkdir(parents=True)
    text = content if isinstance(content, bytes) else json.dumps(content).encode()
    (folder / "job.json").write_bytes(text)
    return folder


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "job.json: empty"),
        (b'{"executor": "slu', "job.json: not valid JSON"),
        (b"\xff\xfe{}", "job.json: not UTF-8 text"),
        ([1, 2], "expected a JSON object"),
        ("WRONG-TYPE", "num_tasks: expected an integer"),
        ("SCHEMA", "schema 7, expected 1"),
    ],
)
def test_plain_status_lists_every_run_and_says_which_record_is_damaged(
    cli, tmp_path, content, reason
):
    runs = tmp_path / "runs"
    good = make_run(runs / "a-good-run", record(runs / "a-good-run"))
    if content == "WRONG-TYPE":
        content = record(runs / "bad", num_tasks="2")
    if content == "SCHEMA":
        content = record(runs / "bad", schema=7)
    make_run(runs / "bad", content)
    code, out, err = cli("status")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line}
    assert "4242" in rows["a-good-run"] and "UNKNOWN" in rows["a-good-run"]
    assert "bad job.json" in rows["bad"]
    assert "bad: runs/bad/job.json: " in out and reason in out
    assert "fix: the record of the job is damaged" in out
    assert good.is_dir()


@pytest.mark.parametrize(
    "command", [("logs",), ("logs", "-f"), ("cancel",), ("report",), ("status",)]
)
def test_a_folder_that_does_not_exist_is_one_line(cli, command):
    code, out, err = cli(*command, "/nope/run")
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in out + err
    assert "/nope/run: no such" in err and "fix:" in err


def test_folder_arguments_are_normalised(cli, tmp_path, monkeypatch):
    """``../../x`` names the folder it is, in messages and in what hpcrl writes."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    code, _, err = cli("logs", "../../nope")
    assert code == 1 and f"{tmp_path / 'nope'}: no such" in err and ".." not in err
    code, _, err = cli("render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", "../../run")
    assert code == 0, err
    assert read_jobspec(tmp_path / "run").run_dir == str(tmp_path / "run")


def test_logs_of_a_rendered_run_says_how_to_submit_it(cli, tmp_path):
    assert cli("render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", "run")[0] == 0
    code, _, err = cli("logs", "run")
    assert code == 1
    assert f"{tmp_path / 'run'}: rendered but never submitted (no job.json)" in err
    assert (
        f"fix: submit it with: hpcrl submit grpo-tiny-1n-cpu --cluster local -o {tmp_path / 'run'}"
        in err
    )


@pytest.mark.parametrize(
    "sacct, says",
    [
        ("missing", "cannot run scancel for job 4242: No such file or directory"),
        ("empty", "scancel 4242 failed: scancel: error: Invalid job id specified"),
    ],
)
def test_a_missing_or_failing_scancel_is_one_line_naming_the_job(cli, tmp_path, sacct, says):
    run = make_run(tmp_path / "run", record(tmp_path / "run"))
    code, _, err = cli("cancel", str(run), sacct=sacct)
    assert code == 1
    assert says in err and "fix: check the job with: squeue -j 4242" in err


@pytest.mark.parametrize(
    "sacct, says, code",
    [
        ("empty", "job 4242 the scheduler has no record of this job", 1),
        ("fail", "job 4242 the scheduler has not answered for a while; the job may still run", 1),
        ("completed", "job 4242 completed", 0),
    ],
)
def test_logs_follow_always_ends_and_says_why(cli, tmp_path, monkeypatch, sacct, says, code):
    short = waiting.WaitSettings(poll_s=0.02, unknown_grace_s=0.2, unreachable_grace_s=0.2)
    monkeypatch.setattr(waiting, "default_wait_settings", lambda: short)
    run = make_run(tmp_path / "run", record(tmp_path / "run"))
    (run / "submitit").mkdir()
    (run / "submitit" / "4242_0_log.out").write_text("hello from node 0\n")
    exit_code, out, err = cli("logs", "-f", str(run), sacct=sacct)
    assert exit_code == code
    assert "[node0 stdout] hello from node 0" in out
    assert says in err
    # one line saying why, no warning per sacct call; a failing sacct's error said once, first
    assert err.count("\n") == (2 if sacct == "fail" else 1), err
    if sacct == "fail":
        assert err.startswith("hpcrl logs: the scheduler is not answering (sacct exited 1: ")


def scheduler_calls(monkeypatch) -> list:
    """Every command hpcrl.submit.job_state runs (sacct, squeue), in order; they still run."""
    calls = []
    real_run = subprocess.run

    def counting_run(command, **kwargs):
        calls.append(command)
        return real_run(command, **kwargs)

    monkeypatch.setattr("hpcrl.submit.job_state.subprocess.run", counting_run)
    return calls


def test_status_asks_the_scheduler_once_for_all_runs(cli, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for index in range(5):
        make_run(runs / f"r{index}", record(runs / f"r{index}", job_id=str(100 + index)))
    calls = scheduler_calls(monkeypatch)
    code, out, _ = cli("status", sacct="completed")
    assert code == 0 and out.count("COMPLETED") == 5
    (call,) = calls
    assert call[-10:] == ["-j", "100", "-j", "101", "-j", "102", "-j", "103", "-j", "104"]


def test_logs_follow_of_a_sweep_asks_the_scheduler_once_for_all_points(cli, tmp_path, monkeypatch):
    sweep = tmp_path / "sw"
    sweep.mkdir()
    points = tuple(build_points(["grpo.seed=1,2,3"]))
    write_sweep_record(sweep, SweepRecord(name="sw", recipe_source="r", cluster="c",
                                          overrides=(), swept_keys=("grpo.seed",), points=points))  # fmt: skip
    for index in range(3):  # resumed points: each its own job
        make_run(sweep / f"point-{index}", record(sweep / f"point-{index}", job_id=f"30{index}"))
    calls = scheduler_calls(monkeypatch)
    code, _, err = cli("logs", "-f", str(sweep), sacct="completed")
    assert code == 0
    assert err.count("completed") == 3, err
    (call,) = calls
    assert call[0] == "sacct" and call[-6:] == ["-j", "300", "-j", "301", "-j", "302"]


def test_duplicate_sweep_points_are_refused(cli):
    code, _, err = cli(
        "sweep", "grpo-tiny-2n-cpu", "-c", "slurm-test", "--grid", "grpo.seed=1,2,1", "--no-submit"
    )
    assert code == 2
    assert "--grid grpo.seed: 1 listed more than once" in err and "fix: list each value once" in err
    code, _, err = cli("sweep", "grpo-tiny-2n-cpu", "-c", "slurm-test", "--zip", "grpo.seed=1,1",
                       "--zip", "grpo.max_num_steps=2,2", "--no-submit")  # fmt: skip
    assert code == 2 and "the same values appear twice" in err


@pytest.mark.parametrize(
    "grid, key, says",
    [
        (("grpo.seed=1,01,2",), "grpo.seed",
         "sweep points 0 (grpo.seed=1) and 1 (grpo.seed=01) resolve to the same recipe"),
        (("policy.optimizer.kwargs.lr=1e-3,0.001", "grpo.seed=7,8"), "policy.optimizer.kwargs.lr",
         "sweep points 1 (policy.optimizer.kwargs.lr=1e-3, grpo.seed=8) and 3 "
         "(policy.optimizer.kwargs.lr=0.001, grpo.seed=8) resolve to the same recipe"),
    ],
)  # fmt: skip
def test_points_that_resolve_to_the_same_recipe_are_refused(cli, tmp_path, grid, key, says):
    """Values that differ only as text: compared as the typed recipe takes them, every pair
    reported together, nothing written."""
    grids = [word for axis in grid for word in ("--grid", axis)]
    code, _, err = cli("sweep", "grpo-tiny-2n-cpu", "-c", "slurm-test", *grids, "--no-submit",
                       "-o", "sw")  # fmt: skip
    assert code == 2
    flat = " ".join(err.split())
    assert f"error {key} = " in flat and says in flat, err
    assert "fix: list each value once (" in flat
    if len(grid) == 2:  # both seeds' pairs at once
        assert "2 errors" in flat and "sweep points 0 (" in flat
    assert not (tmp_path / "sw").exists()


def test_a_smaller_resweep_leaves_no_stale_point_folders(cli, tmp_path):
    grid = ("sweep", "grpo-tiny-2n-cpu", "-c", "slurm-test", "--no-submit", "-o", "sw", "--grid")
    assert cli(*grid, "grpo.seed=1,2,3,4")[0] == 0
    assert cli(*grid, "grpo.seed=5,6")[0] == 0
    points = sorted(
        path.name for path in (tmp_path / "sw").iterdir() if path.name.startswith("point-")
    )
    assert points == ["point-0", "point-1"]
    # A stale point that holds results is never removed: the re-sweep is refused.
    assert cli(*grid, "grpo.seed=1,2,3")[0] == 0
    (tmp_path / "sw" / "point-2" / "metrics.jsonl").write_text("{}\n")
    code, _, err = cli(*grid, "grpo.seed=7")
    assert code == 2 and "point-2 of an earlier sweep" in err and "metrics.jsonl" in err
    assert (tmp_path / "sw" / "point-2" / "metrics.jsonl").exists()


def test_debug_shows_the_stack(cli):
    with pytest.raises(Exception, match="no such run folder"):
        cli("--debug", "logs", "/nope/run")
