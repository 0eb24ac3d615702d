"""Planning Ray authentication: on by default, ``ray_auth: none`` warned, overrides refused."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config.errors import ConfigError
from hpcrl.plan.planner import plan
from hpcrl.plan.ray_auth import NO_AUTH_RISK
from tests.plan.planning_inputs import GOLDEN_RUN_DIR, plain_slurm_profile, pyxis_profile
from tests.recipe_builder import automodel_recipe, megatron_recipe


def make_plan(recipe, profile):
    return plan(recipe, profile, run_dir=GOLDEN_RUN_DIR, recipe_source="recipes/x.yaml")


def test_token_auth_is_the_default_and_the_plan_names_the_file_not_the_token():
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=2), plain_slurm_profile())
    assert spec.ray_auth == "token"
    assert spec.ray_token_path == f"{GOLDEN_RUN_DIR}/auth/ray_token"
    assert spec.warnings == ()
    (check,) = [check for check in spec.checks if check.name == "ray_auth"]
    assert check.status == "passed"
    assert "<run_dir>/auth/ray_token (mode 0600)" in check.message


def test_opting_out_is_planned_with_a_warning_that_names_the_risk():
    profile = plain_slurm_profile(ray_auth="none")
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=2), profile)
    assert (spec.ray_auth, spec.ray_token_path) == ("none", None)
    (warning,) = spec.warnings
    assert warning.path == "profile[plain].ray_auth"
    assert warning.message == NO_AUTH_RISK
    assert "run code as you" in warning.message and "credentials" in warning.message
    assert "remove `ray_auth: none`" in warning.fix


@pytest.mark.parametrize(
    ("profile_changes", "recipe", "path"),
    [
        ({"env": {"RAY_AUTH_MODE": "disabled"}}, None, "profile[site].env.RAY_AUTH_MODE"),
        ({"env": {"RAY_AUTH_TOKEN_PATH": "/x"}}, None, "profile[site].env.RAY_AUTH_TOKEN_PATH"),
        ({"pass_env": ("HF_TOKEN", "RAY_AUTH_TOKEN")}, None, "profile[site].pass_env[1]"),
        ({}, {"RAY_AUTH_MODE": "disabled"}, "policy.megatron_cfg.env_vars.RAY_AUTH_MODE"),
    ],
)
def test_ray_auth_variables_from_profile_or_recipe_are_errors(profile_changes, recipe, path):
    profile = pyxis_profile(**profile_changes)
    recipe_obj = megatron_recipe()
    if recipe is not None:
        megatron_cfg = attrs.evolve(recipe_obj.policy.megatron_cfg, env_vars=recipe)
        recipe_obj = attrs.evolve(
            recipe_obj, policy=attrs.evolve(recipe_obj.policy, megatron_cfg=megatron_cfg)
        )
    with pytest.raises(ConfigError) as caught:
        make_plan(recipe_obj, profile)
    problems = {problem.path: problem for problem in caught.value.errors}
    assert "set ray_auth: none in the profile" in problems[path].fix
    assert "hpcrl sets Ray's authentication variables itself" in problems[path].message
