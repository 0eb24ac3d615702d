"""jobspec.json, the one contract from plan to job: every shipped recipe × profile that plans
comes back from the file as an equal typed ``JobSpec``; a missing, corrupt, foreign or stale
file is one ``JobSpecError`` naming the file and the fix; ``hpcrl render`` writes it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hpcrl
from hpcrl.config import ConfigError, list_recipes, load_profile, load_recipe
from hpcrl.plan.planner import plan
from hpcrl.run.jobspec_file import (
    JOBSPEC_FILE,
    JobSpecError,
    JobSpecMissing,
    jobspec_as_dict,
    read_jobspec,
    write_jobspec,
)
from tests.plan.planning_inputs import isolate_from_user_profiles, plain_slurm_profile
from tests.recipe_builder import megatron_recipe
from tests.render.test_golden import shipped_profiles

PAIRS = [(recipe, profile) for recipe in list_recipes() for profile in shipped_profiles()]


@pytest.fixture(autouse=True)
def shipped_profiles_only(monkeypatch, tmp_path):
    isolate_from_user_profiles(monkeypatch, tmp_path)


def plan_pair(recipe_name: str, profile_name: str, run_dir) -> object | None:
    try:
        return plan(
            load_recipe(recipe_name).recipe,
            load_profile(shipped_profiles()[profile_name]),
            run_dir=str(run_dir),
            recipe_source=recipe_name,
            profile_source=profile_name,
        )
    except ConfigError:
        return None  # invalid by design: tests/render/golden/<pair>.problems


def test_every_shipped_plan_comes_back_from_the_file_equal(tmp_path):
    planned = []
    for recipe_name, profile_name in PAIRS:
        run_dir = tmp_path / f"{recipe_name}__{profile_name}"
        run_dir.mkdir()
        spec = plan_pair(recipe_name, profile_name, run_dir)
        if spec is None:
            continue
        assert write_jobspec(spec) == run_dir / JOBSPEC_FILE
        assert read_jobspec(run_dir) == spec, (recipe_name, profile_name)
        planned.append(spec)
    # The pairs cover every optional part of the plan, so each one was read back at least once.
    assert len(planned) >= 14
    assert {spec.device for spec in planned} == {"cpu", "gpu"}
    assert {spec.scheduler for spec in planned} == {"local", "slurm"}
    assert any(spec.container is not None for spec in planned)
    assert any(spec.generation is not None for spec in planned)
    assert any(spec.megatron_checkpoint_dir is not None for spec in planned)
    assert any(spec.cpus_per_node is not None for spec in planned)
    assert any(value is None for spec in planned for _, value in spec.sbatch_directives)


def test_a_plan_with_warnings_comes_back_equal(tmp_path):
    # Two nodes converting under $HOME: the planner warns (no shipped pair does).
    spec = plan(megatron_recipe(num_nodes=2, gpus_per_node=2), plain_slurm_profile(),
                run_dir=str(tmp_path), recipe_source="grpo-x")  # fmt: skip
    assert [check.name for check in spec.warnings] == ["megatron_checkpoint_dir"]
    write_jobspec(spec)
    assert read_jobspec(tmp_path) == spec


@pytest.fixture
def written(tmp_path):
    spec = plan(
        megatron_recipe(num_nodes=1, gpus_per_node=2),
        load_profile("local"),
        run_dir=str(tmp_path),
        recipe_source="grpo-x.yaml",
        overrides=["grpo.seed=3"],
    )
    write_jobspec(spec)
    return spec, tmp_path / JOBSPEC_FILE


def error_of(run_dir) -> str:
    with pytest.raises(JobSpecError) as caught:
        read_jobspec(run_dir)
    return str(caught.value)


RESUBMIT = "submit it again with this hpcrl (hpcrl submit grpo-x.yaml --cluster local grpo.seed=3)"


def test_a_missing_file_names_itself_and_how_to_get_one(tmp_path):
    with pytest.raises(JobSpecMissing) as caught:
        read_jobspec(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / JOBSPEC_FILE} does not exist, so this job has no plan: the run folder was "
        "not written by `hpcrl render`/`hpcrl submit`, or the file was removed. Fix: submit "
        "the recipe again with this hpcrl (hpcrl submit RECIPE --cluster PROFILE)"
    )


def test_a_truncated_file_is_named_not_a_traceback(written):
    _, path = written
    path.write_text(path.read_text()[:200])
    message = error_of(path.parent)
    assert message.startswith(f"{path} cannot be read as JSON (")
    assert message.endswith("Fix: submit the recipe again with this hpcrl (hpcrl submit RECIPE "
                            "--cluster PROFILE)")  # fmt: skip


def test_a_file_of_another_hpcrl_version_names_both_versions_and_the_command(written):
    _, path = written
    record = json.loads(path.read_text())
    path.write_text(json.dumps(record | {"hpcrl_version": "0.0.9"}))
    assert error_of(path.parent) == (
        f"{path} was written by hpcrl 0.0.9, but this job runs hpcrl {hpcrl.__version__} "
        f"(from {hpcrl.__path__[0]}); a plan is only read by the hpcrl that made it. "
        f"Fix: {RESUBMIT}, which writes a new run folder; with code: bundle in the cluster "
        "profile the job always runs the hpcrl that planned it"
    )


def test_the_flat_file_of_earlier_hpcrl_is_refused(written):
    spec, path = written
    path.write_text(json.dumps(jobspec_as_dict(spec)))  # no version, no "jobspec" key
    assert error_of(path.parent).startswith(
        f"{path} was written by an unknown hpcrl, but this job runs hpcrl {hpcrl.__version__}"
    )


def test_fields_this_hpcrl_does_not_know_or_lacks_are_listed(written):
    _, path = written
    record = json.loads(path.read_text())
    del record["jobspec"]["device"]
    record["jobspec"]["visible_gpuz"] = "0,1"
    record["jobspec"]["layout"]["tp"] = "2"
    path.write_text(json.dumps(record))
    assert error_of(path.parent) == (
        f"{path} does not match the JobSpec of this hpcrl {hpcrl.__version__} (device: required "
        "key is missing; layout.tp: expected an integer, got the string '2'; visible_gpuz: "
        f"unknown key 'visible_gpuz'). Fix: {RESUBMIT}, which writes a new run folder"
    )


def test_render_writes_the_plan_the_job_reads(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "hpcrl.cli.main", "render", "grpo-tiny-1n-cpu-megatron",
         "--cluster", "local", "-o", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"  {JOBSPEC_FILE}\n" in result.stdout
    spec = read_jobspec(out)
    assert (spec.run_dir, spec.profile_name, spec.layout.backend) == (str(out), "local", "megatron")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["plan"] == json.loads((out / JOBSPEC_FILE).read_text())["jobspec"]
