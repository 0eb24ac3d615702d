"""hpcrl sweep (one job array) and hpcrl report on the real test Slurm cluster, plus the
pyxis profile. (Requeue after USR2 with the real driver: tests/submit/test_slurm_faults.py.)"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcrl.report.summary import format_number
from hpcrl.run.job_record import read_job_record
from hpcrl.run.sweep_record import read_sweep_record
from tests.slurm.harness import sacct_states
from tests.submit import drivers
from tests.submit.jobs_harness import (
    FRACTION_KEY,
    OFFLOAD_ON,
    ONE_NODE_OVERRIDES,
    ONE_NODE_RECIPE,
    RECIPES,
    TWO_NODE_RECIPE,
    hpcrl,
    job_env,
    output_of,
    read_json,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]
FRACTIONS = ("0.25", "0.5", "0.75", "1.0")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_offload_fraction_sweep_runs_as_one_array_and_reports(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    args = ["sweep", ONE_NODE_RECIPE, *ONE_NODE_OVERRIDES, *OFFLOAD_ON, "--cluster", "slurm-test",
            "--grid", f"{FRACTION_KEY}={','.join(FRACTIONS)}", "-o", str(sweep_dir), "--wait"]  # fmt: skip
    result = hpcrl(args, tmp_path, job_env("tests.submit.drivers:write_metrics"), timeout_s=280)
    assert result.returncode == 0, output_of(result)
    sweep = read_sweep_record(sweep_dir)
    array_id = sweep.array_job_id
    records = [read_job_record(sweep_dir / p.run_dir_name) for p in sweep.points]
    assert [r.job_id for r in records] == [f"{array_id}_{i}" for i in range(len(FRACTIONS))]
    # the array script submititted is the rendered one, with bounded parallelism
    script = (sweep_dir / "job.sbatch").read_text()
    assert (sweep_dir / "submitit" / f"{array_id}_submission.sh").read_text() == script
    assert "#SBATCH --array=0-3%2" in script
    assert all(sacct_states(r.job_id) == ["COMPLETED"] for r in records)
    # --wait followed every point at once, then a summary row per point with its value
    assert f"{len(FRACTIONS)} jobs: {len(FRACTIONS)}/{len(FRACTIONS)} done · " in result.stdout
    summary = result.stdout.split(f"sweep {sweep_dir.name}")[-1]
    for point, fraction in zip(sweep.points, FRACTIONS, strict=True):
        row = next(line for line in summary.splitlines() if f"/{point.run_dir_name} " in line)
        assert f"optimizer_offload_fraction={fraction}" in row and "COMPLETED" in row, row
    # each point's banner names its array task, not Slurm's own id for the task
    logs = hpcrl(["logs", str(sweep_dir), "--point", "1", "--node", "0"], tmp_path, job_env())
    assert f"[point-1 node0 stderr] ===== hpcrl attempt 1 · job {array_id}_1 · " in logs.stdout
    for point, fraction in zip(sweep.points, FRACTIONS, strict=True):
        resolved = yaml.safe_load(
            (sweep_dir / point.run_dir_name / "recipe.resolved.yaml").read_text()
        )
        assert drivers.offload_fraction(resolved) == float(fraction)

    report = hpcrl(
        ["report", str(sweep_dir), "--out", str(tmp_path / "plots")], tmp_path, job_env()
    )
    assert report.returncode == 0, output_of(report)
    rows = {
        line.split("│")[1].strip(): line
        for line in report.stdout.splitlines()
        if "│ point-" in line
    }
    for index, fraction in enumerate(FRACTIONS):
        steps = [
            drivers.expected_metrics(float(fraction), s)
            for s in range(1, drivers.NUM_METRIC_STEPS + 1)
        ]
        times = [m["time_step_s"] for m in steps]
        cells = [cell.strip() for cell in rows[f"point-{index}"].split("│")[1:-1]]
        # two tasks at once on two nodes may land on one node: then a "shared node" column
        shared = cells[11:]
        assert shared in ([], [""], ["yes"]), cells
        assert cells[:11] == [
            f"point-{index}", fraction, "COMPLETED", str(drivers.NUM_METRIC_STEPS),
            format_number(float(np.median(times))), format_number(float(np.percentile(times, 95))),
            format_number(steps[0]["tokens_per_s"]), "—", format_number(steps[0]["peak_host_rss_gb"]),
            format_number(steps[-1]["loss"]), format_number(steps[-1]["reward_mean"]),
        ]  # fmt: skip
    plots = sorted((tmp_path / "plots").glob("*.png"))
    assert [p.name for p in plots] == [
        "step_time.png",
        "training.png",
        "vs_optimizer_offload_fraction.png",
    ]
    assert [_png_size(p) for p in plots] == [(800, 500), (1300, 750), (800, 500)]
    assert all(f"plot: {p}" in report.stdout for p in plots)


def test_pyxis_profile_options_reach_every_node(tmp_path: Path) -> None:
    run = tmp_path / "run"
    data = tmp_path / "toy_count.jsonl"  # under the profile's one mount (/tmp), as planning asks
    shutil.copyfile(RECIPES / "data" / data.name, data)
    args = ["submit", TWO_NODE_RECIPE, "--cluster", "slurm-test-pyxis", "-o", str(run), "--wait",
            f"data.train_path={data}"]  # fmt: skip
    result = hpcrl(args, tmp_path, job_env("tests.submit.drivers:container_env"))
    assert result.returncode == 0, output_of(result)
    seen = sorted(read_json(run / "container_env.json"), key=lambda node: node["rank"])
    assert [node["host"] for node in seen] == ["n1", "n2"]
    for node in seen:
        assert node["env"]["PYXIS_STANDIN_CONTAINER_IMAGE"] == "hpcrl-test:latest"
        assert "/tmp:/tmp" in node["env"]["PYXIS_STANDIN_CONTAINER_MOUNTS"].split(",")
        assert node["env"]["PYXIS_STANDIN_CONTAINER_WORKDIR"] == "/tmp"
