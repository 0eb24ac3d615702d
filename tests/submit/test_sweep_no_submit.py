"""``hpcrl sweep --no-submit``: the sweep folder without a job, run by hand (the Megatron offload
benchmark on a GPU machine without Slurm), then ``hpcrl report`` on the records it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.megatron_offload import step_record
from benchmarks.megatron_sweep_points import PointError, point_flags, read_resolved
from hpcrl.cli.main import main
from hpcrl.run.jobspec_file import read_jobspec
from hpcrl.run.metrics_file import MetricsWriter
from tests.plan.planning_inputs import isolate_from_user_profiles

REPO = Path(__file__).resolve().parents[2]
RECIPE = "recipes/grpo-llama-1b-1n1g-megatron.yaml"
OPT = "policy.megatron_cfg.optimizer"
# The offload switch and the fraction move together: fraction 0 is "offload off" (a fraction
# with the switch on must be in (0, 1]).
SWEEP_ARGS = [
    "sweep", RECIPE, "--cluster", "slurm-test",
    "--zip", f"{OPT}.optimizer_cpu_offload=false,true,true,true",
    "--zip", f"{OPT}.optimizer_offload_fraction=0,0.25,0.5,1.0",
    "--no-submit", "-o", "sw",
]  # fmt: skip


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    (tmp_path / "recipes").symlink_to(REPO / "recipes")


@pytest.fixture
def sweep_dir(tmp_path, capsys) -> Path:
    assert main(SWEEP_ARGS) == 0
    capsys.readouterr()
    return tmp_path / "sw"


def test_no_submit_prints_the_points_and_submits_nothing(tmp_path, capsys):
    assert main(SWEEP_ARGS) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Wrote sweep sw with 4 points (not submitted)",
        f"  sw/point-0  {OPT}.optimizer_cpu_offload=false, {OPT}.optimizer_offload_fraction=0",
        f"  sw/point-1  {OPT}.optimizer_cpu_offload=true, {OPT}.optimizer_offload_fraction=0.25",
        f"  sw/point-2  {OPT}.optimizer_cpu_offload=true, {OPT}.optimizer_offload_fraction=0.5",
        f"  sw/point-3  {OPT}.optimizer_cpu_offload=true, {OPT}.optimizer_offload_fraction=1.0",
        "  report      hpcrl report sw",
    ]
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert sweep["array_job_id"] is None and sweep["submitted_at"] is None
    assert [p["run_dir"] for p in sweep["points"]] == [f"point-{i}" for i in range(4)]
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == [
        ".hpcrl.lock", "job.sbatch", "jobspec.json", "manifest.json", "point-0", "point-1",
        "point-2", "point-3", "recipe.resolved.yaml", "sweep.json",
    ]  # fmt: skip
    fractions = []
    for index in range(4):
        point = tmp_path / "sw" / f"point-{index}"
        assert not (point / "job.json").exists() and not (point / "submitit").exists()
        # The plan the point's job would read, ready for a run by hand.
        assert read_jobspec(point).run_dir == str(point.absolute())
        optimizer = yaml.safe_load((point / "recipe.resolved.yaml").read_text())["policy"]
        optimizer = optimizer["megatron_cfg"]["optimizer"]
        fractions.append(
            (optimizer["optimizer_cpu_offload"], optimizer["optimizer_offload_fraction"])
        )
    assert fractions == [(False, 0.0), (True, 0.25), (True, 0.5), (True, 1.0)]


def test_no_submit_with_wait_is_refused(tmp_path, capsys):
    assert main([*SWEEP_ARGS, "--wait"]) == 2
    assert "--wait needs a submitted sweep" in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()


def test_no_submit_never_imports_submitit(tmp_path):
    """The GPU machine has no submitit: the unsubmitted sweep must not need it."""
    code = (
        "import sys; from hpcrl.cli.main import main; "
        f"assert main({SWEEP_ARGS!r}) == 0; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('submitit', 'torch')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]"


def test_benchmark_flags_follow_each_point_recipe(sweep_dir):
    flags = [point_flags(read_resolved(sweep_dir / f"point-{i}")) for i in range(4)]
    model = ["--layers", "16", "--hidden", "2048", "--heads", "16", "--ffn", "5632",
             "--vocab", "32000"]  # fmt: skip
    for (ranks, point), fraction in zip(flags, ["0.0", "0.25", "0.5", "1.0"], strict=True):
        assert ranks == 1
        assert point == [
            "--tp", "1", "--dp", "1", "--fraction", fraction, "--lr", "5e-06",
            "--seq-len", "512", "--batch-size", "64", "--micro-batch-size", "32", *model,
        ]  # fmt: skip


def test_a_point_the_benchmark_cannot_build_is_named(sweep_dir):
    resolved = read_resolved(sweep_dir / "point-0")
    resolved["policy"]["model_name"] = "meta-llama/Llama-3.2-1B"
    with pytest.raises(PointError, match="builds the model from a tiny: spec"):
        point_flags(resolved)


def _write_point_records(point_dir: Path, step_s: float, gpu_gb: float, rss_gb: float) -> None:
    writer = MetricsWriter(point_dir / "metrics.jsonl")
    for step, loss in enumerate([10.5, 10.25, 10.0], start=1):
        writer.write(step_record(step, loss, 1.5, 32768.0, step_s * step, gpu_gb, rss_gb + step))


def test_report_reads_the_benchmark_records_into_the_table(sweep_dir, capsys):
    for index, (step_s, gpu_gb, rss_gb) in enumerate(
        [(1.0, 40.0, 10.0), (1.25, 35.5, 14.0), (1.5, 31.0, 18.0), (2.0, 22.0, 26.0)]
    ):
        _write_point_records(sweep_dir / f"point-{index}", step_s, gpu_gb, rss_gb)
    assert main(["report", str(sweep_dir), "--out", str(sweep_dir / "plots")]) == 0
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert lines[:9] == EXPECTED_TABLE, "\n".join(lines)
    assert (sweep_dir / "plots" / "vs_optimizer_offload_fraction.png").is_file()


# Values by hand: point-0 steps take 1, 2, 3 s → median 2, p95 2.9, 32768/2 tok/s; RSS peak
# 10 + 3; the last loss 10. The report rounds to 4 significant digits.
EXPECTED_TABLE = [
    "sweep sw",
    "┏━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━┓",
    "┃ run     ┃ optimizer_cpu_offload ┃ optimizer_offload_fraction ┃ steps ┃ median step s ┃ p95 step s ┃  tokens/s ┃ peak GPU GB ┃ peak RSS GB ┃ final loss ┃ final reward ┃",
    "┡━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━┩",
    "│ point-0 │ false                 │ 0                          │     3 │             2 │        2.9 │ 1.638e+04 │          40 │          13 │         10 │            — │",
    "│ point-1 │ true                  │ 0.25                       │     3 │           2.5 │      3.625 │ 1.311e+04 │        35.5 │          17 │         10 │            — │",
    "│ point-2 │ true                  │ 0.5                        │     3 │             3 │       4.35 │ 1.092e+04 │          31 │          21 │         10 │            — │",
    "│ point-3 │ true                  │ 1.0                        │     3 │             4 │        5.8 │      8192 │          22 │          29 │         10 │            — │",
    "└─────────┴───────────────────────┴────────────────────────────┴───────┴───────────────┴────────────┴───────────┴─────────────┴─────────────┴────────────┴──────────────┘",
]
