"""A sweep over a memory setting where one point runs out of GPU memory: that point fails
with a named cause (where, the peak), the sweep goes on to the next point, and ``hpcrl
status`` / ``hpcrl report`` show which points fit. The real training driver and workers run;
only the GPU is a stand-in (tests/submit/oom_standin.py says how)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcrl.run.causes import GPU_OOM, read_cause
from tests.submit import oom_standin
from tests.submit.jobs_harness import hpcrl, job_env, output_of, own_ray_ports_env

AC_KEY = "policy.automodel_cfg.activation_checkpointing"


@pytest.mark.slow  # two real GRPO jobs on CPU, one after the other (~1-2 min here)
def test_a_point_out_of_gpu_memory_is_reported_as_oom_with_its_peak(tmp_path: Path) -> None:
    sweep = tmp_path / "sw"
    args = ["sweep", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", str(sweep),
            "--grid", f"{AC_KEY}=false,true", "grpo.max_num_steps=2", "--wait"]  # fmt: skip
    env = job_env(
        "tests.submit.oom_standin:train_with_a_small_gpu", **own_ray_ports_env(os.getpid() % 30)
    )
    result = hpcrl(args, tmp_path, env, timeout_s=600)
    oom, fits = sweep / "point-0", sweep / "point-1"
    # the sweep says one point failed, and still ran the next one to the end
    assert result.returncode == 1, output_of(result)
    assert json.loads((fits / "status" / "done").read_text())["exit_code"] == 0

    cause = read_cause(oom, 0)
    assert cause is not None and cause.kind == GPU_OOM, output_of(result)
    assert cause.peak_gpu_mem_gb == oom_standin.PRETEND_PEAK_GB[False]
    line = cause.line()
    assert line.startswith("out of GPU memory at train, peak 131.5 GiB: worker rank "), line
    assert f" in train: {oom_standin.STAND_IN_MESSAGE}; exit code 1 (log: " in line, line
    assert "out of GPU memory at train, peak 131.5 GiB" in result.stdout  # --wait says it

    status = hpcrl(["status", str(sweep)], tmp_path, job_env())
    assert status.returncode == 0, output_of(status)
    rows = {name: next(line for line in status.stdout.splitlines() if f"{name} " in line)
            for name in ("point-0", "point-1")}  # fmt: skip
    assert "FAILED (OOM)" in rows["point-0"] and "out of GPU memory at train" in status.stdout
    assert "COMPLETED" in rows["point-1"] and "OOM" not in rows["point-1"]

    report = hpcrl(["report", str(sweep), "--json"], tmp_path, job_env())
    assert report.returncode == 0, output_of(report)
    by_name = {row["name"]: row for row in json.loads(report.stdout)["rows"]}
    assert by_name["point-0"]["state"] == "OOM"
    assert by_name["point-0"]["summary"]["peak_gpu_mem_gb"] == 131.5
    assert by_name["point-0"]["notes"] == [line]
    assert by_name["point-1"]["state"] == "COMPLETED"
    assert by_name["point-1"]["summary"]["num_steps"] == 2
    assert by_name["point-1"]["summary"]["peak_gpu_mem_gb"] == 70.25
    table = hpcrl(["report", str(sweep)], tmp_path, job_env())
    row = next(text for text in table.stdout.splitlines() if "point-0" in text and "OOM" in text)
    assert "131.5" in row and "false" in row.lower(), table.stdout
