"""``hpcrl status`` fits the terminal (issue 26 item 1): at 80, 100 and 120 columns, 12 runs
with long names and long causes take one line each (the table at 167264e took 140 lines at
100 columns, names cut into 7-character pieces); ``--wide`` and ``status RUN`` show every
field in full. sacct is a stand-in script on PATH (tests/cli/test_status_view.py)."""

from __future__ import annotations

import json
import sys

import pytest

from hpcrl.cli.main import main
from hpcrl.run.causes import AttemptCause, write_cause
from hpcrl.run.logger_destinations import write_destinations
from hpcrl.submit.status_table import cut_text, fit_columns
from tests.cli.test_status_view import SACCT, _run_folder
from tests.plan.planning_inputs import isolate_from_user_profiles

NAMES = [f"grpo-qwen2-1.5b-2n8g-megatron-eos-{index:02d}ab401fdb" for index in range(12)]
CAUSE = AttemptCause(
    attempt=0, kind="driver_raised",
    what="worker rank 3 on node 1 (n2) raised torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 2.00 GiB (GPU 3; 79.11 GiB total capacity)",
    after_step=17, exit_code=1, log="logs/node0/attempt0/driver.log",
)  # fmt: skip


@pytest.fixture
def twelve_runs(tmp_path, monkeypatch):
    """12 runs: half failed with a 200-character cause, half running at step 5/4."""
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    jobs = {}
    for index, name in enumerate(NAMES):
        job_id = str(300 + index)
        failed = index % 2 == 0
        jobs[job_id] = ("FAILED", "1:0", "4000") if failed else ("RUNNING", "0:0", "1234")
        run = _run_folder(tmp_path / "runs" / name, job_id, "grpo-qwen2-1.5b-2n8g-megatron",
                          metrics=[{"step": 5, "reward_mean": 0.125, "loss": 0.5}])  # fmt: skip
        if failed:
            write_cause(run, CAUSE)
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sacct = SACCT.replace("PYTHON", sys.executable)
    (bin_dir / "sacct").write_text(sacct.replace("JOBS_FILE", repr(str(tmp_path / "jobs.json"))))
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path / "runs"


def _status(capsys, monkeypatch, columns: int, *argv: str) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["status", *argv]) == 0
    return capsys.readouterr().out.splitlines()


RUN_STATE = f"{'run':<44}  {'state':<7}"


@pytest.mark.parametrize(
    "columns, header, note",
    [
        (80, f"{RUN_STATE}  step  cause",
         ["(left out: job, exit, attempts, reward, loss, elapsed; cut short: cause)",
          "in full: hpcrl status --wide"]),
        (100, f"{RUN_STATE}  exit  step  reward  loss  cause",
         ["(left out: job, attempts, elapsed; cut short: cause) in full: hpcrl status --wide"]),
        (120, f"{'run':<44}  job  {'state':<7}  exit  step  reward  loss  elapsed  cause",
         ["(left out: attempts; cut short: cause) in full: hpcrl status --wide"]),
    ],
)  # fmt: skip
def test_twelve_runs_take_one_line_each_at_80_100_and_120_columns(
    twelve_runs, capsys, monkeypatch, columns, header, note
):
    lines = _status(capsys, monkeypatch, columns)
    assert len(lines) == 1 + 12 + len(note)
    assert lines[0] == header
    assert lines[13:] == note
    assert max(len(line) for line in lines) <= columns
    for name, line in zip(NAMES, lines[1:13], strict=True):
        assert line.startswith(name + "  ")  # whole, never split
    failed, running = lines[1], lines[2]
    # the cause takes what is left (less a space before the ellipsis)
    assert failed.endswith("…") and "  worker rank 3 on n" in failed and len(failed) >= columns - 1
    assert " FAILED " in failed and " 5/4 " in failed
    assert " RUNNING " in running and not running.endswith("…")


def test_wide_shows_every_column_in_full(twelve_runs, capsys, monkeypatch):
    lines = _status(capsys, monkeypatch, 80, "--wide")
    assert len(lines) == 13
    assert lines[0].split() == ["run", "job", "state", "exit", "attempts", "step", "reward",
                                "loss", "elapsed", "cause"]  # fmt: skip
    assert lines[1].endswith(CAUSE.line())
    assert lines[2].split() == [NAMES[1], "301", "RUNNING", "1", "5/4", "0.125", "0.5", "0:20:34"]


def test_one_run_is_shown_in_full_wrapped_at_spaces(twelve_runs, capsys, monkeypatch):
    wandb = twelve_runs / NAMES[0] / "logs" / "wandb" / "offline-run-20261203_1"
    write_destinations(twelve_runs / NAMES[0], [
        {"logger": "wandb", "mode": "offline", "folder": str(wandb)},
        {"logger": "tensorboard", "folder": "/lustre/tb"},
    ])  # fmt: skip
    lines = _status(capsys, monkeypatch, 80, f"runs/{NAMES[0]}")
    # where the run's loggers write (issue 26 item 5), a folder never broken across lines
    first = lines.index(next(line for line in lines if line.startswith("loggers ")))
    block = [lines[first]] + [line for line in lines[first + 1 : first + 6] if line[:11].isspace()]
    assert " ".join(" ".join(block).split()) == (
        f"loggers wandb offline: {wandb} (upload: wandb sync {wandb}) tensorboard: /lustre/tb"
    )
    assert f"           {wandb}" in block and block[-1] == "           tensorboard: /lustre/tb"
    # at most 80 columns but for a word too long for any line (a path), alone on its line
    assert all(len(line) <= 80 or len(line[11:].split()) == 1 for line in lines)
    assert lines[:6] == [
        f"run        {NAMES[0]}",
        f"folder     {twelve_runs / NAMES[0]}",
        "recipe     grpo-qwen2-1.5b-2n8g-megatron",
        "state      FAILED, exit code 1",
        "job        300 · 1 attempt · elapsed 1:06:40 · submitted",
        "           2026-11-29T10:00:00+00:00",
    ]
    first = next(index for index, line in enumerate(lines) if line.startswith("cause "))
    cause_lines = [lines[first]]
    for line in lines[first + 1 :]:
        if not line.startswith(" " * 11):
            break
        cause_lines.append(line)
    assert len(cause_lines) == 4
    cause = " ".join(line[11:] for line in cause_lines)
    assert cause == CAUSE.line()  # every word of it, in order
    assert lines[-1] == f"logs       hpcrl logs runs/{NAMES[0]}"


def test_a_name_longer_than_the_line_keeps_its_start_and_end() -> None:
    name = "a-very-long-recipe-name-for-a-run-that-someone-typed-by-hand-" + "x" * 40 + "-401fdb21"
    assert cut_text(name, 24, middle=True) == "a-very-long-…xx-401fdb21"
    rows = [{"run": name, "state": "RUNNING", "step": "1/2"}]
    kept, widths = fit_columns(["run", "state", "step"], rows, 40)
    assert kept == ["run", "state"] and widths["run"] + 2 + widths["state"] == 40
