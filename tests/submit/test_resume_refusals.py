"""What ``hpcrl resume`` and ``hpcrl rerun`` refuse, each in one line with the fix (exit 1):
runs rendered but never submitted, without a checkpoint, sweeps, folders that are not runs.
(The real resumes and reruns: tests/submit/test_resume_rerun.py, test_slurm_jobs.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, " ".join(captured.err.split())

    return run


def rendered(cli, tmp_path: Path, *overrides: str) -> Path:
    assert cli("render", "grpo-tiny-1n-cpu", "-c", "local", "-o", "run", *overrides)[0] == 0
    return tmp_path / "run"


def ended_local_job(run: Path) -> None:
    """job.json of a local job long over: its controller is gone, it left no result."""
    record = {
        "executor": "local", "job_id": "999999999", "job_name": "grpo-tiny-1n-cpu",
        "cluster": "local", "submitit_folder": str(run / "submitit"), "num_tasks": 1,
        "submitted_at": "2026-11-29T10:00:00+00:00", "max_requeues": 0, "schema": 1,
    }  # fmt: skip
    (run / "job.json").write_text(json.dumps(record))


def test_a_run_never_submitted_is_not_resumed(cli, tmp_path) -> None:
    run = rendered(cli, tmp_path)
    code, _, err = cli("resume", str(run))
    assert code == 1
    assert f"{run}: rendered but never submitted (no job.json)" in err
    assert f"submit it with: hpcrl submit grpo-tiny-1n-cpu --cluster local -o {run}" in err


def test_a_run_without_a_checkpoint_is_not_resumed_and_rerun_is_the_fix(cli, tmp_path) -> None:
    run = rendered(cli, tmp_path)
    ended_local_job(run)
    code, _, err = cli("resume", str(run))
    assert code == 1
    assert (
        f"{run}: no complete checkpoint in {run / 'checkpoints'} (checkpointing.enabled is "
        "false); a resumed attempt would start again at step 1" in err
    )
    # the command as the user types it here: the folder relative to the working directory
    assert "start a new run from its recipe instead: hpcrl rerun run (with" in err
    assert not (run / "submitit").exists()  # nothing was submitted


def test_a_sweep_is_resumed_or_rerun_point_by_point(cli, tmp_path) -> None:
    args = ("sweep", "grpo-tiny-1n-cpu", "-c", "local", "--grid", "grpo.seed=1,2", "-o", "sw")
    assert cli(*args, "--no-submit")[0] == 0
    for command in ("resume", "rerun"):
        code, _, err = cli(command, str(tmp_path / "sw"))
        assert code == 1
        assert f"is a sweep; hpcrl {command} takes one run" in err
        assert "give one point folder (point-0, point-1)" in err


def test_rerun_needs_a_run_folder(cli, tmp_path) -> None:
    (tmp_path / "notarun").mkdir()
    code, _, err = cli("rerun", str(tmp_path / "notarun"))
    assert code == 1 and f"{tmp_path / 'notarun'}: no recipe.resolved.yaml" in err
