"""One reader of the scheduler's environment: ``hpcrl.job.slurm_env`` (as submitit's
``JobEnvironment``). Every other module takes its ``SlurmTask`` (or its banner), so a Slurm
variable's meaning is decided once."""

from __future__ import annotations

import ast
from pathlib import Path

from hpcrl.job.settings import port_band
from hpcrl.job.slurm_env import banner_of, read_slurm_task, shown_job_id

HPCRL = Path(__file__).resolve().parents[2] / "hpcrl"
READER = HPCRL / "job" / "slurm_env.py"
#: Names of Slurm variables elsewhere that read nothing: (file, text, why).
NOT_READS = {
    ("plan/planner.py", "SLURM_"): "a profile's env may not set the scheduler's variables",
    ("submit/job_state.py", "SLURM_TIME_FORMAT"): "set for sacct, which hpcrl runs",
}


def slurm_names(path: Path) -> set[str]:
    """Every string constant of ``path`` (f-string parts too) that starts with a Slurm
    variable's name."""
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith(("SLURM_", "SLURMD_"))
    }


def test_only_slurm_env_names_slurm_variables():
    found = {
        (str(path.relative_to(HPCRL)), name)
        for path in HPCRL.rglob("*.py")
        if path != READER
        for name in slurm_names(path)
    }
    assert found == set(NOT_READS)
    assert {"SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_RESTART_COUNT"} <= slurm_names(READER)


def test_an_array_task_is_read_once_for_its_banner_and_its_port_band():
    environ = {
        "SLURM_JOB_ID": "30", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NNODES": "2", "SLURM_ARRAY_JOB_ID": "20", "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_RESTART_COUNT": "1",
    }  # fmt: skip
    task = read_slurm_task(environ)
    assert (task.job_id, task.array_job_id, task.array_task_id) == ("30", "20", "3")
    assert (task.node_rank, task.node_name, task.attempt) == (1, "n2", 1)
    assert shown_job_id(environ) == "20_3"
    assert banner_of(environ, attempt_offset=2).startswith(
        "===== hpcrl attempt 4 · job 20_3 · node 1 ("
    )
    # The band of the array task (20 + 3), not of the task's own job id (30).
    plain = read_slurm_task({**environ, "SLURM_ARRAY_JOB_ID": "", "SLURM_ARRAY_TASK_ID": ""})
    assert (port_band({}, task), port_band({}, plain)) == (23, 30)
