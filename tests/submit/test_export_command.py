"""What ``hpcrl export`` refuses, each in one line with the fix (exit 2), and how it picks the
checkpoint (newest, ``--step N``, ``--best`` by ``checkpointing.metric_name``); and what the
export module says when the Python it runs in lacks a package. No conversion runs here (the
real exports: tests/core/test_export.py, tests/megatron/test_checkpoint.py (its export test), the Slurm job:
tests/slurm/test_export_job.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import recipes
from hpcrl.cli.main import main
from hpcrl.core import export as export_module
from hpcrl.submit.exports import pick_checkpoint
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


def rendered(cli, tmp_path: Path, profile: str = "local", *overrides: str) -> Path:
    args = ("render", "sft-tiny-1n-cpu", "-c", profile, "-o", "run", *overrides)
    assert cli(*args)[0] == 0
    return tmp_path / "run"


def saved(run: Path, *steps: int) -> list[Path]:
    """Step folders as the checkpoint store leaves them (their content is not read here)."""
    folders = [run / "checkpoints" / f"step_{step:06d}" for step in steps]
    for folder in folders:
        folder.mkdir(parents=True)
    return folders


def test_a_run_without_a_checkpoint_has_nothing_to_export(cli, tmp_path):
    run = rendered(cli, tmp_path)
    code, _, err = cli("export", str(run))
    assert code == 2
    assert (
        f"{run}: no complete checkpoint in {run / 'checkpoints'} (checkpointing.enabled is "
        "false): nothing to export (fix: train with checkpointing.enabled=true" in err
    )


def test_the_newest_by_default_a_named_step_or_the_best_by_the_runs_metric(cli, tmp_path):
    run = rendered(
        cli, tmp_path, "local", "checkpointing.enabled=true",
        "checkpointing.metric_name=val:val_loss", "checkpointing.higher_is_better=false",
    )  # fmt: skip
    two, four, six = saved(run, 2, 4, 6)
    (run / "checkpoints" / "checkpoint_metrics.json").write_text(
        json.dumps({"2": 0.9, "4": 0.3, "6": 0.5})
    )
    assert pick_checkpoint(run, None, False) == (6, six)
    assert pick_checkpoint(run, 2, False) == (2, two)
    assert pick_checkpoint(run, None, True) == (4, four)  # lowest val_loss
    code, _, err = cli("export", str(run), "--step", "3")
    assert (code, err) == (2, f"hpcrl export: error: {run}: no complete checkpoint of step 3 in "
                              f"{run / 'checkpoints'} (fix: pick one of the steps saved: 2, 4, 6)")  # fmt: skip


def test_best_needs_the_runs_metric(cli, tmp_path):
    run = rendered(cli, tmp_path, "local", "checkpointing.enabled=true")
    saved(run, 1, 2)
    code, _, err = cli("export", str(run), "--best")
    assert code == 2
    assert "--best needs checkpointing.metric_name in the run's recipe" in err
    assert "(fix: pick a step with --step N (saved: 1, 2))" in err


def test_a_folder_holding_something_else_is_never_written_over(cli, tmp_path):
    run = rendered(cli, tmp_path)
    saved(run, 1)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    code, _, err = cli("export", str(run), "-o", "mine")
    assert code == 2
    assert f"{tmp_path / 'mine'} already exists and holds something else" in err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_here_is_refused_for_a_run_in_a_container_naming_the_export_job(cli, tmp_path):
    data = tmp_path / "sft_tiny.jsonl"  # under the profile's one mount, /tmp
    shutil.copyfile(Path(recipes.__file__).parent / "data" / data.name, data)
    run = rendered(cli, tmp_path, "slurm-test-pyxis", "cluster.gpus_per_node=1",
                   f"data.train_path={data}")  # fmt: skip
    saved(run, 1)
    code, _, err = cli("export", str(run), "--here")
    assert code == 2
    assert (
        "the run's Python lives in its container image (hpcrl-test:latest), which only a Slurm "
        "job step can enter (fix: leave out --here: hpcrl export then submits a one-node "
        "export job with the run's image, mounts and environment)" in err
    )
    assert not (run / "exports").exists()


def test_the_export_module_names_what_its_python_lacks(tmp_path, monkeypatch, capsys):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["render", "sft-tiny-1n-cpu", "-c", "local", "-o", "run"]) == 0
    (checkpoint,) = saved(tmp_path / "run", 1)
    missing = {"automodel": (("transformers", "transformers"), ("no-such-pkg", "hpcrl_nothing"))}
    monkeypatch.setattr(export_module, "NEEDED", missing)
    capsys.readouterr()
    code = export_module.main([str(tmp_path / "run"), str(checkpoint), str(tmp_path / "out")])
    assert code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("hpcrl export: this Python (") and (
        "lacks no-such-pkg, which exporting a checkpoint of the automodel backend needs" in err
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_missing_folder_or_a_sweep_is_refused_naming_what_to_give(cli, tmp_path):
    code, _, err = cli("export", "nothere")
    assert (code, err) == (2, f"hpcrl export: error: {tmp_path / 'nothere'} does not exist "
                              "(fix: name a run folder (hpcrl status lists them))")  # fmt: skip
    args = ("sweep", "sft-tiny-1n-cpu", "-c", "local", "--grid", "sft.seed=1,2", "-o", "sw")
    assert cli(*args, "--no-submit")[0] == 0
    code, _, err = cli("export", "sw")
    assert code == 1
    assert "is a sweep; hpcrl export takes one run" in err
    assert "give one point folder (point-0, point-1)" in err


class ExportJobStandIn:
    """Stand-in for a submitit job whose export log grows while it runs (a real export job
    ends before the 5 s poll sees a tiny model's phases: tests/slurm/test_export_job.py
    submits the real one). ``done()`` is the poll: each call appends the next log line."""

    def __init__(self, log: Path, lines: list[str]) -> None:
        self.job_id, self.state, self.log, self.lines = "42", "PENDING", log, list(lines)
        self.paths = type("Paths", (), {"stdout": log, "stderr": log})()

    def done(self) -> bool:
        if not self.lines:
            self.state = "COMPLETED"
            return True
        self.state = "RUNNING"
        with open(self.log, "a") as log:
            log.write(self.lines.pop(0) + "\n")
        return False


def test_wait_shows_each_new_phase_the_export_job_logs(tmp_path):
    from hpcrl.run.export_progress import newest_progress
    from hpcrl.submit.export_submission import wait_for_export

    log = tmp_path / "42_0_log.out"
    assert newest_progress(log) is None  # no log yet
    lines = ["submitit noise", "hpcrl export: [    0 s] reading 24 model tensors (0.01 GiB) "
             "from /c/dcp", "more noise", "hpcrl export: [    3 s] writing the Hugging Face "
             "folder /o.partial (safetensors, config, tokenizer)"]  # fmt: skip
    said: list[str] = []
    code = wait_for_export(ExportJobStandIn(log, lines), tmp_path / "out", said.append, 0.0)
    assert code == 1  # the stand-in writes no folder: the log is named
    assert said == [
        "export job 42: RUNNING",
        "export job 42: [    0 s] reading 24 model tensors (0.01 GiB) from /c/dcp",
        "export job 42: [    3 s] writing the Hugging Face folder /o.partial (safetensors, "
        "config, tokenizer)",
        f"export job 42 ended COMPLETED without writing {tmp_path / 'out'}; its log: {log}",
    ]
