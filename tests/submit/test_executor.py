"""The rendered-script executor's guards (no cluster needed; the hook itself is exercised
against real Slurm in test_slurm_jobs.py)."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import attrs
import pytest
import submitit

from hpcrl.submit.executor import (
    RenderedLocalExecutor,
    RenderedSlurmExecutor,
    ScriptCommandMismatch,
    SubmititHookError,
    check_submitit_hook,
    time_limit_to_min,
)
from tests.require import unavailable


def test_installed_submitit_has_the_private_hooks() -> None:
    assert submitit.__version__ == "1.5.4"
    check_submitit_hook()


def test_a_missing_hook_fails_loudly_naming_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(submitit.SlurmExecutor, "_make_submission_file_text")
    with pytest.raises(SubmititHookError) as error:
        check_submitit_hook()
    assert "submitit==1.5.4 (installed: 1.5.4)" in str(error.value)
    assert "SlurmExecutor._make_submission_file_text is missing" in str(error.value)


def test_a_changed_hook_signature_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(self, command, uid, extra):  # noqa: ANN001, ANN202
        return ""

    monkeypatch.setattr(submitit.SlurmExecutor, "_make_submission_file_text", changed)
    with pytest.raises(SubmititHookError, match=r"'extra'\) != expected"):
        check_submitit_hook()


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("01:00:00", 60),
        ("10", 10),
        ("0:50", 1),
        ("2:30", 3),
        ("1-0", 1440),
        ("1-02:03", 1563),
        ("00:00:30", 1),
    ],
)
def test_time_limits_in_minutes(text: str, minutes: int) -> None:
    assert time_limit_to_min(text) == minutes


@pytest.mark.parametrize("text", ["1:2:3:4", "abc", "1-x"])
def test_bad_time_limits(text: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        time_limit_to_min(text)


def test_slurm_executor_refuses_a_script_for_another_folder(tmp_path: Path) -> None:
    if shutil.which("srun") is None:
        unavailable("slurm", "submitit's SlurmExecutor needs srun on PATH (Slurm's client tools)")
    folder = tmp_path / "submitit"
    other = f"python3 -u -m submitit.core._submit {shlex.quote(str(tmp_path / 'other'))}"
    executor = RenderedSlurmExecutor(
        folder, script_text="#!/bin/bash\n", task_command=other, python="python3",
        num_nodes=1, tasks_per_node=1, time_limit_min=1, max_requeues=0,
    )  # fmt: skip
    with pytest.raises(ScriptCommandMismatch, match="runs a different command"):
        executor.submit(print, "never runs")
    assert not list(folder.glob("*_submission.sh"))


def test_local_executor_refuses_a_script_without_the_task_command(tmp_path: Path) -> None:
    folder = tmp_path / "submitit"
    command = f"python3 -u -m submitit.core._submit {shlex.quote(str(folder))}"
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\nexec python3 -c pass\n")
    with pytest.raises(ScriptCommandMismatch, match="must run submitit's task command"):
        RenderedLocalExecutor(
            folder, script_path=script, task_command=command, python="python3",
            time_limit_min=1, max_requeues=0,
        )  # fmt: skip


def _local_gpu_spec(run_dir: Path, gpu_ids: tuple[str, ...]):
    from hpcrl.plan.gpus import LocalGpus
    from hpcrl.plan.planner import plan
    from tests.plan.planning_inputs import GOLDEN_HOST, local_profile
    from tests.recipe_builder import automodel_recipe

    host = attrs.evolve(GOLDEN_HOST, local_gpus=LocalGpus(gpu_ids, "test"), python=sys.executable)
    profile = local_profile(device="gpu", gpus_per_node="auto")
    recipe = automodel_recipe(num_nodes=1, gpus_per_node=len(gpu_ids))
    return plan(recipe, profile, run_dir=str(run_dir), recipe_source="r", host=host)


@pytest.mark.parametrize(
    ("gpu_ids", "visible"), [(("0", "1"), [0, 1]), (("2",), [2]), (("GPU-a", "GPU-b"), None)]
)
def test_local_gpu_jobs_tell_submitit_their_gpus(tmp_path: Path, gpu_ids, visible) -> None:
    """submitit's LocalExecutor hides every GPU unless told; hpcrl tells it the planned ones
    (UUIDs, which it cannot take, reach the job through the script's export alone)."""
    from hpcrl.render.script import render_sbatch
    from hpcrl.submit.submission import build_executor

    spec = _local_gpu_spec(tmp_path, gpu_ids)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    executor = build_executor(spec, script)
    assert executor.parameters["gpus_per_node"] == len(gpu_ids)
    assert executor.parameters.get("visible_gpus") == visible
    assert f"\nexport CUDA_VISIBLE_DEVICES={','.join(gpu_ids)}\n" in script.read_text()


def test_the_executor_runs_the_bundle_entry_as_its_python(tmp_path: Path) -> None:
    from hpcrl.plan.planner import plan
    from hpcrl.render.script import render_sbatch
    from hpcrl.submit.submission import build_executor
    from tests.plan.planning_inputs import GOLDEN_HOST, local_profile
    from tests.recipe_builder import automodel_recipe

    spec = plan(
        automodel_recipe(num_nodes=1, gpus_per_node=2), local_profile(code="bundle"),
        run_dir=str(tmp_path), recipe_source="r", host=GOLDEN_HOST,
    )  # fmt: skip
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    executor = build_executor(spec, script)  # raises ScriptCommandMismatch on a difference
    assert executor.python == spec.python_command
    assert spec.python_command.endswith("/hpcrl_entry.py")
