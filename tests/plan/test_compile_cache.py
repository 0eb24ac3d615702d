"""torch.compile's caches in the plan (hpcrl.plan.compile_cache): one folder every run shares,
beside the run folders unless the profile names one, exported to every task of the job."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError
from hpcrl.plan.planner import plan
from hpcrl.run.jobspec_file import read_jobspec, write_jobspec
from tests.plan.planning_inputs import GOLDEN_HOST, GOLDEN_RUN_DIR, local_profile, pyxis_profile
from tests.recipe_builder import automodel_recipe

DEFAULT = "/runs/.hpcrl-cache/torch-compile"  # GOLDEN_HOST keeps bundles in /runs


def make_plan(recipe, profile, **kwargs):
    kwargs.setdefault("run_dir", GOLDEN_RUN_DIR)
    return plan(recipe, profile, recipe_source="grpo-test", host=GOLDEN_HOST, **kwargs)


def errors_of(recipe, profile) -> dict[str, object]:
    with pytest.raises(ConfigError) as caught:
        make_plan(recipe, profile)
    return {problem.path: problem for problem in caught.value.errors}


def test_the_caches_default_to_one_folder_beside_the_run_folders_and_reach_every_task():
    spec = make_plan(automodel_recipe(1, 2), local_profile())
    assert spec.compile_cache_dir == DEFAULT
    env = spec.env_dict()
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{DEFAULT}/inductor"
    assert env["TRITON_CACHE_DIR"] == f"{DEFAULT}/triton"
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    check = next(check for check in spec.checks if check.name == "compile_cache")
    assert check.message.startswith(f"torch.compile caches in {DEFAULT}, shared by the runs")
    # another run in the same runs folder (another recipe, another run folder): the same one
    other = make_plan(automodel_recipe(1, 1), local_profile(), run_dir="/runs/other")
    assert other.compile_cache_dir == DEFAULT and other.env_dict() == {
        **env, "HPCRL_RUN_DIR": "/runs/other"
    }  # fmt: skip


def test_a_profile_points_them_at_shared_storage_seen_through_a_container_mount(tmp_path):
    shared = "/lustre/cache/torch-compile"
    spec = make_plan(automodel_recipe(2), pyxis_profile(compile_cache_dir=shared))
    assert spec.compile_cache_dir == shared
    assert spec.env_dict()["TORCHINDUCTOR_CACHE_DIR"] == f"{shared}/inductor"
    assert spec.container.mounts == ("/lustre:/lustre", f"{GOLDEN_RUN_DIR}:{GOLDEN_RUN_DIR}",
                                     "/runs/.hpcrl-bundles/hpcrl-0.1.0-0123456789abcdef:"
                                     "/runs/.hpcrl-bundles/hpcrl-0.1.0-0123456789abcdef:ro")  # fmt: skip
    # the typed plan the job reads carries it
    moved = make_plan(automodel_recipe(1, 2), local_profile(compile_cache_dir=shared),
                      run_dir=str(tmp_path / "run"))  # fmt: skip
    (tmp_path / "run").mkdir()
    write_jobspec(moved)
    assert read_jobspec(tmp_path / "run").compile_cache_dir == shared


def test_an_unmounted_or_unusable_folder_is_refused_with_the_fix():
    unmounted = errors_of(automodel_recipe(2), pyxis_profile(compile_cache_dir="/scratch/cc"))
    problem = unmounted["profile[site].container.mounts"]
    assert "the compile cache dir /scratch/cc (from profile[site].compile_cache_dir)" in (
        problem.message
    )
    assert problem.fix == 'add the shared filesystem: container.mounts += ["/scratch:/scratch"]'
    for bad in ("relative/cc", "/lustre/$USER/cc", "/lustre/a:b"):
        problem = errors_of(automodel_recipe(2), pyxis_profile(compile_cache_dir=bad))[
            "profile[site].compile_cache_dir"
        ]
        assert problem.value == bad and "must be an absolute path" in problem.message


@pytest.mark.parametrize("name", ["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"])
def test_the_cache_variables_are_hpcrls_alone(name):
    errors = errors_of(automodel_recipe(1, 2), local_profile(env={name: "/elsewhere"}))
    problem = errors[f"profile[local].env.{name}"]
    assert problem.fix == "remove it and set compile_cache_dir in the cluster profile instead"
