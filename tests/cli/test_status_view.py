"""``hpcrl status`` and ``hpcrl cancel`` over several runs: the columns, pending reasons from
squeue, sweep values, filters, --json, unsubmitted runs. No cluster: ``sacct``, ``squeue`` and
``scancel`` are stand-in scripts on PATH (written below) that answer from a table of jobs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
from hpcrl.submit.pending_reasons import parse_reasons, squeue_command
from hpcrl.submit.status_view import parse_age
from hpcrl.submit.sweep import build_points
from tests.plan.planning_inputs import isolate_from_user_profiles

#: job id -> (sacct State, ExitCode, ElapsedRaw); squeue knows the pending ones' reasons.
JOBS = {
    "101": ("COMPLETED", "0:0", "65"),
    "102": ("PENDING", "0:0", "0"),
    "103": ("FAILED", "7:0", "30"),
    "104_0": ("RUNNING", "0:0", "12"),
    "104_1": ("PENDING", "0:0", "0"),
}
SQUEUE_LINES = "102|Priority\n104_1|JobArrayTaskLimit\n"

SACCT = """#!PYTHON
# stand-in for sacct (tests/cli/test_status_view.py): one row per known job asked for
import json, sys
args = sys.argv[1:]
jobs = json.loads(open(JOBS_FILE).read())
fields = args[args.index("-o") + 1].split(",")
asked = {v for f, v in zip(args, args[1:]) if f == "-j"}
print("|".join(fields))
for job_id, (state, code, elapsed) in jobs.items():
    if job_id.split("_")[0] in asked:
        row = {"JobID": job_id, "State": state, "ExitCode": code, "ElapsedRaw": elapsed}
        print("|".join(row.get(f, "") for f in fields))
"""


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "jobs.json").write_text(json.dumps(JOBS))
    scripts = {
        "sacct": SACCT.replace("PYTHON", sys.executable).replace(
            "JOBS_FILE", repr(str(tmp_path / "jobs.json"))
        ),
        "squeue": f'#!/bin/sh\n# stand-in\necho "$@" >> {tmp_path}/squeue.calls\n'
        f"printf '{SQUEUE_LINES}'\n",
        "scancel": f'#!/bin/sh\n# stand-in\necho "$@" >> {tmp_path}/scancel.calls\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def _run_folder(folder: Path, job_id: str | None, recipe: str, section: str = "grpo",
                metrics: list[dict] | None = None, submitted_at: str | None = None) -> Path:  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"recipe_source": recipe}))
    (folder / "recipe.resolved.yaml").write_text(f"{section}:\n  max_num_steps: 4\n")
    if job_id is not None:
        (folder / "job.json").write_text(json.dumps({
            "executor": "slurm", "job_id": job_id, "job_name": "j", "cluster": "c",
            "submitit_folder": str(folder / "submitit"), "num_tasks": 1, "schema": 1,
            "submitted_at": submitted_at or "2026-11-29T10:00:00+00:00", "max_requeues": 0,
        }))  # fmt: skip
    if metrics:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return folder


def _runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    _run_folder(runs / "a-sft", "101", "sft-tiny-1n-cpu", "sft",
                [{"step": 3, "loss": 0.5}, {"step": 4, "loss": 0.25}])  # fmt: skip
    _run_folder(runs / "b-grpo", "102", "grpo-tiny-1n-cpu")
    _run_folder(runs / "c-failed", "103", "grpo-tiny-1n-cpu", metrics=[{"step": 1, "loss": 2.0}])
    _run_folder(runs / "d-rendered", None, "grpo-tiny-2n-cpu")
    sweep = runs / "s"
    sweep.mkdir()
    points = tuple(build_points(["policy.optimizer.kwargs.lr=1e-5,1e-4"]))
    write_sweep_record(sweep, SweepRecord(name="s", recipe_source="grpo-tiny-1n-cpu",
                                          cluster="c", overrides=(), swept_keys=("policy.optimizer.kwargs.lr",),
                                          points=points, array_job_id="104"))  # fmt: skip
    _run_folder(sweep / "point-0", "104_0", "grpo-tiny-1n-cpu",
                metrics=[{"step": 2, "reward_mean": 0.5, "loss": 1.25}])  # fmt: skip
    _run_folder(sweep / "point-1", "104_1", "grpo-tiny-1n-cpu")
    return runs


def table_rows(out: str) -> list[list[str]]:
    """The cells of ``hpcrl status``'s table (header first): columns are cut where every line
    has at least two spaces, so empty cells stay in their column."""
    lines = [line for line in out.splitlines() if line and not line.startswith(("(", "in full"))]
    width = max(len(line) for line in lines)
    padded = [line.ljust(width) for line in lines]
    blank = [all(line[i] == " " for line in padded) for i in range(width)] + [True, True]
    bounds, start, index = [], None, 0
    while index < width:
        if blank[index] and blank[index + 1]:  # two blank columns: between two columns
            if start is not None:
                bounds.append((start, index))
                start = None
            while blank[index] and index < width:
                index += 1
            continue
        start = index if start is None else start
        index += 1
    if start is not None:
        bounds.append((start, width))
    return [[line[a:b].strip() for a, b in bounds] for line in padded]


def test_the_table_tells_state_exit_reason_step_values_and_loss(cli, tmp_path):
    _runs(tmp_path)
    code, out, err = cli("status")
    assert code == 0, err
    rows = table_rows(out)
    assert rows[0] == ["run", "values", "job", "state", "exit", "attempts", "step", "reward",
                       "loss", "elapsed"]  # fmt: skip
    assert rows[1:] == [
        ["a-sft", "", "101", "COMPLETED", "0", "1", "4/4", "", "0.25", "0:01:05"],
        ["b-grpo", "", "102", "PENDING (Priority)", "", "1", "", "", "", "0:00:00"],
        ["c-failed", "", "103", "FAILED", "7", "1", "1/4", "", "2", "0:00:30"],
        ["d-rendered", "", "", "not submitted", "", "", "", "", "", ""],
        ["s/point-0", "lr=1e-5", "104_0", "RUNNING", "", "1", "2/4", "0.5", "1.25", "0:00:12"],
        ["s/point-1", "lr=1e-4", "104_1", "PENDING (JobArrayTaskLimit)", "", "1", "", "", "",
         "0:00:00"],
    ]  # fmt: skip
    # squeue is asked once, for the pending jobs only, tasks of an array one by one
    assert (
        tmp_path / "squeue.calls"
    ).read_text() == "--noheader --array --format=%i|%r --jobs=102,104\n"


def test_json_has_every_field_for_scripts(cli, tmp_path):
    _runs(tmp_path)
    code, out, _ = cli("status", "--json", str(tmp_path / "runs" / "a-sft"), "runs/s")
    assert code == 0
    runs = json.loads(out)
    assert [run["name"] for run in runs] == ["a-sft", "s/point-0", "s/point-1"]
    assert runs[0] == {
        "name": "a-sft", "path": str(tmp_path / "runs" / "a-sft"), "state": "COMPLETED",
        "job_id": "101", "exit_code": 0, "attempts": 1, "pending_reason": None, "step": 4,
        "max_steps": 4, "reward": None, "loss": 0.25, "elapsed_s": 65.0,
        "recipe": "sft-tiny-1n-cpu", "submitted_at": "2026-11-29T10:00:00+00:00", "swept": {},
        "cause": None, "out_of_gpu_memory": False, "scheduler_error": None, "problem": None,
    }  # fmt: skip
    assert runs[2]["swept"] == {"policy.optimizer.kwargs.lr": "1e-4"}
    assert runs[2]["pending_reason"] == "JobArrayTaskLimit"


def test_a_folder_of_runs_given_stands_for_the_runs_in_it(cli, tmp_path):
    """``hpcrl status runs --recipe sft`` listed one row, ``runs`` itself, as not submitted."""
    _runs(tmp_path)
    code, out, _ = cli("status", "--json", "runs", "--recipe", "sft-")
    assert code == 0 and [run["name"] for run in json.loads(out)] == ["a-sft"]
    code, out, _ = cli("status", "--json", str(tmp_path / "runs"))
    assert [run["name"] for run in json.loads(out)] == [
        "a-sft", "b-grpo", "c-failed", "d-rendered", "s/point-0", "s/point-1",
    ]  # fmt: skip
    (tmp_path / "empty").mkdir()  # a folder with no run in it is still a row that says so
    code, out, _ = cli("status", "--json", "empty")
    assert [(run["name"], run["state"]) for run in json.loads(out)] == [("empty", "NOT_SUBMITTED")]


@pytest.mark.parametrize(
    "filters, names",
    [
        (["--state", "failed,not_submitted"], ["c-failed", "d-rendered"]),
        (["--state", "pending", "--state", "RUNNING"], ["b-grpo", "s/point-0", "s/point-1"]),
        (["--recipe", "sft-"], ["a-sft"]),
        (["--recipe", "grpo-tiny-2n"], ["d-rendered"]),
        (["--since", "1h"], ["d-rendered"]),  # the others were submitted in 2026-11
    ],
)
def test_filters_by_state_recipe_and_age(cli, tmp_path, filters, names):
    _runs(tmp_path)
    code, out, _ = cli("status", "--json", *filters)
    assert code == 0 and [run["name"] for run in json.loads(out)] == names


def test_a_bad_age_is_one_line(cli):
    code, _, err = cli("status", "--since", "2 hours")
    assert code == 1
    assert (
        err
        == "hpcrl status: error: --since: '2 hours' is not an age like 30m, 2h, 1d or 1w (fix: e.g. --since 2h)\n"
    )
    assert parse_age("1h30m") == 5400.0 and parse_age("2w") == 1209600.0


def test_cancel_takes_several_runs_and_sweeps(cli, tmp_path):
    runs = _runs(tmp_path)
    code, out, err = cli("cancel", str(runs / "b-grpo"), str(runs / "a-sft"), str(runs / "s"))
    assert code == 0, err
    assert out.splitlines() == [
        f"Cancelled job 102 ({runs / 'b-grpo'})",
        "Job 101 already ended (COMPLETED); nothing to cancel",
        f"Cancelled job array 104 (2 points) of {runs / 's'}",
    ]
    assert (tmp_path / "scancel.calls").read_text() == "102\n104\n"
    code, out, err = cli("cancel", str(runs / "d-rendered"), str(runs / "b-grpo"))
    assert code == 1 and "rendered but never submitted" in err
    assert out == f"Cancelled job 102 ({runs / 'b-grpo'})\n"


def test_squeue_lines_are_read_by_job_id() -> None:
    assert parse_reasons("41|Priority\n42|None\n43_2|Resources\njunk\n") == {
        "41": "Priority", "43_2": "Resources"
    }  # fmt: skip
    assert squeue_command(["43_2", "43_1", "41"])[-1] == "--jobs=41,43"
