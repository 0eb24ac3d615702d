"""hpcrl sweep (one job array) and hpcrl report on the real test Slurm cluster, plus the
pyxis profile and requeue on timeout."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcrl.report.summary import format_number
from hpcrl.submit.job_record import read_job_record
from hpcrl.submit.job_state import query_status
from hpcrl.submit.sweep import read_sweep_record
from tests.slurm.harness import sacct_states
from tests.submit import drivers
from tests.submit.jobs_harness import (
    FRACTION_KEY,
    OFFLOAD_ON,
    ONE_NODE_OVERRIDES,
    ONE_NODE_RECIPE,
    REPO,
    TWO_NODE_RECIPE,
    hpcrl,
    job_env,
    output_of,
    read_json,
    wait_for,
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
    args = ["submit", TWO_NODE_RECIPE, "--cluster", "slurm-test-pyxis", "-o", str(run), "--wait"]
    result = hpcrl(args, tmp_path, job_env("tests.submit.drivers:container_env"))
    assert result.returncode == 0, output_of(result)
    seen = sorted(read_json(run / "container_env.json"), key=lambda node: node["rank"])
    assert [node["host"] for node in seen] == ["n1", "n2"]
    for node in seen:
        assert node["env"]["PYXIS_STANDIN_CONTAINER_IMAGE"] == "hpcrl-test:latest"
        assert "/tmp:/tmp" in node["env"]["PYXIS_STANDIN_CONTAINER_MOUNTS"].split(",")
        assert node["env"]["PYXIS_STANDIN_CONTAINER_WORKDIR"] == "/tmp"


def test_timeout_signal_requeues_once_and_the_run_resumes(tmp_path: Path) -> None:
    """Slurm's time-limit warning (USR2, sent here with scancel as submitit's own tests do:
    Slurm may send ``--signal`` up to 60 s early, too coarse for a test-sized limit) makes
    the job checkpoint, requeue once, and resume where it stopped; each attempt's logs apart."""
    profile = yaml.safe_load((REPO / "cluster_profiles" / "slurm-test.yaml").read_text())
    profile["name"] = "slurm-test-requeue"
    profile["slurm"].update(time_limit="00:05:00", signal_delay_s=30, max_requeues=1)
    (tmp_path / "requeue.yaml").write_text(yaml.safe_dump(profile))
    run = tmp_path / "run"
    args = ["submit", ONE_NODE_RECIPE, *ONE_NODE_OVERRIDES, "--cluster", str(tmp_path / "requeue.yaml"),
            "-o", str(run)]  # fmt: skip
    result = hpcrl(args, tmp_path, job_env("tests.submit.drivers:resume_after_preempt"))
    assert result.returncode == 0, output_of(result)
    record = read_job_record(run)
    try:
        state = run / "probe_state.json"
        wait_for(
            lambda: state.exists() and read_json(state)["steps"] >= 3, 120, "the driver to run"
        )
        subprocess.run(["scancel", "--signal=USR2", record.job_id], check=True, timeout=30)
        # Slurm starts a requeued job on its next scheduling pass (up to a minute here)
        wait_for(lambda: query_status(record).is_final, 200, "the requeued job to end")
        assert sacct_states(record.job_id) == ["REQUEUED", "COMPLETED"]
        progress = read_json(state)
        assert progress["attempts"] == [0, 1] and progress["finished"] is True
        for attempt in (1, 2):
            logs = hpcrl(["logs", str(run), "--attempt", str(attempt)], tmp_path, job_env())
            assert f"===== hpcrl attempt {attempt} · job {record.job_id}" in logs.stdout, output_of(
                logs
            )
            assert f"===== hpcrl attempt {3 - attempt} " not in logs.stdout, (
                "attempts are kept apart"
            )
            assert f"\n[node0 attempt{attempt} driver.log] " in logs.stdout
        # the node entrypoint's contract: on USR2 it writes PREEMPT and the driver stops at a step
        # boundary (a driver killed by the signal instead would lose the step in progress)
        assert progress.get("stopped_for_preempt") is True, "attempt 1's driver did not see PREEMPT"
    finally:  # never leave it running
        subprocess.run(["scancel", record.job_id], check=False, timeout=30)
