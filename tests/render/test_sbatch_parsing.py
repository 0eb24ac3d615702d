"""Real Slurm reads the rendered #SBATCH lines back to exactly the values hpcrl planned.

The renderer shell-quotes #SBATCH values; this checks against the test cluster's sbatch
(held jobs, cancelled right away: nothing runs) that Slurm's own parser undoes that quoting.
"""

from __future__ import annotations

import subprocess

import attrs
import pytest

from hpcrl.config import load_profile
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.recipe_builder import automodel_recipe
from tests.render.sbatch_parser import parse_sbatch_argument

HOSTILE_VALUES = [
    "plain-name",
    'it\'s a "job" $(touch x) `y` ; z && w',
    "a b#c * ? [x] {a,b} ~ \\ ! |",
    "back\\\\slash\\'\\\" tail\\",
]


def submit_held(script_path) -> str:
    result = subprocess.run(
        ["sbatch", "--parsable", "--hold", str(script_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job_fields(job_id: str) -> dict[str, str]:
    """JobName, Comment and StdOut as scontrol shows them (values may contain spaces)."""
    text = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    fields = {}
    for line in text.splitlines():
        stripped = line.strip()
        if " JobName=" in line:
            fields["JobName"] = line.split(" JobName=", 1)[1]
        for key in ("Comment", "StdOut", "StdErr"):
            if stripped.startswith(f"{key}="):
                fields[key] = stripped.split("=", 1)[1]
    return fields


@pytest.mark.slurm
@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_sbatch_reads_back_quoted_values(value, tmp_path):
    profile = load_profile("slurm-test")
    profile = attrs.evolve(
        profile, slurm=attrs.evolve(profile.slurm, sbatch_args=(f"--comment={value}",))
    )
    recipe = automodel_recipe(num_nodes=2, gpus_per_node=profile.slots_per_node)
    run_dir = tmp_path / "run"
    spec = plan(recipe, profile, run_dir=str(run_dir), recipe_source="r", job_name=value)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    job_id = submit_held(script)
    try:
        fields = job_fields(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=60, check=False)
    lines = {
        line.split("=", 1)[0]: line
        for line in script.read_text().splitlines()
        if line.startswith("#SBATCH")
    }
    assert (
        parse_sbatch_argument(lines["#SBATCH --job-name"].removeprefix("#SBATCH "))
        == f"--job-name={value}"
    )
    assert fields["JobName"] == value
    assert fields["Comment"] == value
    assert fields["StdOut"] == f"{run_dir}/submitit/{job_id}_0_log.out"
    assert fields["StdErr"] == f"{run_dir}/submitit/{job_id}_0_log.err"
