"""Pre-flight planning of paths and environment: the checkpoint dir, mounts, HOME and HF_HOME,
the job's environment variables, and Ray's ports (the rest: test_planner.py)."""

from __future__ import annotations

import attrs

from hpcrl.config.profile import ContainerCfg, RayPortsCfg
from tests.plan.planning_inputs import (
    GOLDEN_HOME,
    GOLDEN_HOST,
    GOLDEN_RUN_DIR,
    make_plan,
    plain_slurm_profile,
    plan_errors,
    pyxis_profile,
    warnings_of,
)
from tests.recipe_builder import automodel_recipe, megatron_recipe, with_policy


# --------------------------------------------------------------------------- checkpoint dir, mounts
def test_megatron_checkpoint_dir_follows_the_profile_env():
    explicit = pyxis_profile(
        env={"NRL_MEGATRON_CHECKPOINT_DIR": "/lustre/ckpt", "HF_HOME": "/lustre/hf"}
    )
    spec = make_plan(megatron_recipe(), explicit)
    assert (spec.megatron_checkpoint_dir, spec.megatron_checkpoint_dir_source) == (
        "/lustre/ckpt",
        "NRL_MEGATRON_CHECKPOINT_DIR",
    )
    spec = make_plan(megatron_recipe(), pyxis_profile())
    assert (spec.megatron_checkpoint_dir, spec.megatron_checkpoint_dir_source) == (
        "/lustre/cache/hf/nemo_rl",
        "HF_HOME",
    )
    assert make_plan(automodel_recipe(num_nodes=2), pyxis_profile()).megatron_checkpoint_dir is None


def test_the_recipes_env_vars_win_over_the_profile_env_as_in_the_job():
    # The job exports policy.megatron_cfg.env_vars after the profile's env (and the Megatron
    # worker once more): the planned dir must be the one they name.
    recipe = megatron_recipe(env_vars={"NRL_MEGATRON_CHECKPOINT_DIR": "/lustre/mine"})
    spec = make_plan(recipe, pyxis_profile(env={"NRL_MEGATRON_CHECKPOINT_DIR": "/lustre/site"}))
    assert (spec.megatron_checkpoint_dir, spec.megatron_checkpoint_dir_source) == (
        "/lustre/mine",
        "NRL_MEGATRON_CHECKPOINT_DIR",
    )
    assert ("NRL_MEGATRON_CHECKPOINT_DIR", "/lustre/mine") in spec.env
    recipe = megatron_recipe(env_vars={"HF_HOME": "/lustre/my_hf"})
    spec = make_plan(recipe, pyxis_profile())
    assert spec.megatron_checkpoint_dir == "/lustre/my_hf/nemo_rl"


def test_a_checkpoint_dir_from_the_recipe_outside_the_mounts_names_the_recipe_key():
    recipe = megatron_recipe(env_vars={"NRL_MEGATRON_CHECKPOINT_DIR": "/scratch/mine"})
    problem = plan_errors(recipe, pyxis_profile())["profile[site].container.mounts"]
    assert problem.message.startswith(
        "the Megatron checkpoint dir /scratch/mine (from "
        "policy.megatron_cfg.env_vars.NRL_MEGATRON_CHECKPOINT_DIR) is not under any container mount"
    )


def test_a_shell_naming_another_checkpoint_dir_is_warned_about(monkeypatch):
    # sbatch passes the submitting shell's environment to the job, but the job converts into
    # the planned directory: a NeMo RL habit (HF_HOME exported in the shell) is named.
    monkeypatch.setenv("HF_HOME", "/shared/hf")
    spec = make_plan(megatron_recipe(num_nodes=1, gpus_per_node=2), plain_slurm_profile())
    assert spec.megatron_checkpoint_dir == f"{GOLDEN_HOME}/.cache/huggingface/nemo_rl"
    (warning,) = spec.warnings
    assert (warning.name, warning.path) == (
        "megatron_checkpoint_dir_shell",
        "profile[plain].env.HF_HOME",
    )
    assert warning.message == (
        "this shell sets HF_HOME=/shared/hf, but the job converts Megatron checkpoints into "
        f"{GOLDEN_HOME}/.cache/huggingface/nemo_rl: the directory is planned from the "
        "profile's env and policy.megatron_cfg.env_vars only"
    )
    assert warning.fix == (
        "to convert under it, set profile[plain].env.HF_HOME (or "
        "policy.megatron_cfg.env_vars.HF_HOME) to /shared/hf"
    )
    # Where the profile decides anyway (its NRL_MEGATRON_CHECKPOINT_DIR wins), nothing to say.
    monkeypatch.setenv("NRL_MEGATRON_CHECKPOINT_DIR", "/shared/ckpt")
    profile = plain_slurm_profile(env={"HOME": GOLDEN_HOME, "NRL_MEGATRON_CHECKPOINT_DIR": "/x"})
    assert make_plan(megatron_recipe(num_nodes=1, gpus_per_node=2), profile).warnings == ()


def test_checkpoint_dir_outside_the_mounts_names_the_mount_to_add():
    profile = pyxis_profile(
        env={"NRL_MEGATRON_CHECKPOINT_DIR": "/scratch/ckpt", "HF_HOME": "/lustre/hf"}
    )
    problem = plan_errors(megatron_recipe(), profile)["profile[site].container.mounts"]
    assert "/scratch/ckpt" in problem.message
    assert 'container.mounts += ["/scratch:/scratch"]' in problem.fix


def test_hf_home_outside_the_mounts_is_an_error_for_every_backend():
    profile = pyxis_profile(env={"HF_HOME": "/data/hf"})
    problem = plan_errors(automodel_recipe(num_nodes=2), profile)["profile[site].container.mounts"]
    assert "HF_HOME /data/hf" in problem.message
    assert '["/data:/data"]' in problem.fix


def test_home_fallback_warns_on_multi_node_and_must_be_mounted():
    mounted_home = pyxis_profile(
        env={"HOME": GOLDEN_HOME}, container=ContainerCfg(image="img", mounts=("/home:/home",))
    )
    spec = make_plan(megatron_recipe(num_nodes=2), mounted_home)
    assert spec.megatron_checkpoint_dir == f"{GOLDEN_HOME}/.cache/huggingface/nemo_rl"
    assert spec.megatron_checkpoint_dir_source == "home"
    assert "NRL_MEGATRON_CHECKPOINT_DIR" in warnings_of(spec)["profile[site].env"].fix
    single = make_plan(
        with_policy(megatron_recipe(num_nodes=1), train_global_batch_size=64), mounted_home
    )
    assert not single.warnings
    unmounted = pyxis_profile(env={"HOME": GOLDEN_HOME})
    assert "profile[site].container.mounts" in plan_errors(megatron_recipe(num_nodes=2), unmounted)
    home_mounted_by_pyxis = pyxis_profile(
        env={"HOME": GOLDEN_HOME}, container=ContainerCfg(image="img", mount_home=True)
    )
    assert (
        make_plan(
            megatron_recipe(num_nodes=2), home_mounted_by_pyxis
        ).megatron_checkpoint_dir_source
        == "home"
    )


def test_home_defaults_to_the_submitting_users(monkeypatch):
    monkeypatch.setenv("HOME", "/home/submitter")
    spec = make_plan(megatron_recipe(num_nodes=1, gpus_per_node=2), plain_slurm_profile(env={}))
    assert spec.megatron_checkpoint_dir == "/home/submitter/.cache/huggingface/nemo_rl"


def test_run_dir_and_code_bundle_are_mounted_one_to_one_unless_covered():
    spec = make_plan(automodel_recipe(num_nodes=2), pyxis_profile())
    bundle = "/runs/.hpcrl-bundles/hpcrl-0.1.0-0123456789abcdef"
    cache = "/runs/.hpcrl-cache/torch-compile"  # beside the bundles: shared by the runs
    assert spec.code.bundle is not None and spec.code.bundle.path == bundle
    assert spec.container.mounts == (
        "/lustre:/lustre",
        f"{GOLDEN_RUN_DIR}:{GOLDEN_RUN_DIR}",
        f"{bundle}:{bundle}:ro",  # read-only: the job never writes its code
        f"{cache}:{cache}",  # written: torch.compile's caches
    )
    on_lustre = attrs.evolve(GOLDEN_HOST, bundles_dir="/lustre/runs/.hpcrl-bundles")
    spec = make_plan(
        automodel_recipe(num_nodes=2), pyxis_profile(), run_dir="/lustre/runs/a", host=on_lustre
    )
    assert spec.container.mounts == ("/lustre:/lustre",)


def test_bad_mount_and_run_dir_are_errors():
    profile = pyxis_profile(
        container=ContainerCfg(image="img", mounts=("/lustre:/lustre", "relative:/x", "/a,/b"))
    )
    errors = plan_errors(automodel_recipe(num_nodes=2), profile, run_dir="runs/x")
    assert {
        "profile[site].container.mounts[1]",
        "profile[site].container.mounts[2]",
        "run_dir",
    } <= set(errors)
    assert (
        "'%'"
        in plan_errors(automodel_recipe(num_nodes=2), pyxis_profile(), run_dir="/runs/100%")[
            "run_dir"
        ].message
    )


# --------------------------------------------------------------------------- env, names, ports
def test_env_is_sorted_with_defaults_and_recipe_env_vars_last():
    recipe = megatron_recipe(env_vars={"NCCL_DEBUG": "INFO", "HF_HOME": "/lustre/from-recipe"})
    spec = make_plan(recipe, pyxis_profile(env={"HF_HOME": "/lustre/hf", "ZZ": "1"}))
    names = [name for name, _ in spec.env]
    assert names == sorted(names)
    env = spec.env_dict()
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert env["HPCRL_RUN_DIR"] == GOLDEN_RUN_DIR
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["HF_HOME"] == "/lustre/from-recipe"


def test_env_names_must_be_identifiers_and_not_reserved():
    recipe = megatron_recipe(env_vars={"A B": "1"})
    profile = pyxis_profile(
        env={"HPCRL_RUN_DIR": "/x", "HF_HOME": "/lustre/hf"}, pass_env=("HF_HOME", "$(x)")
    )
    errors = plan_errors(recipe, profile)
    assert "shell identifier" in errors["policy.megatron_cfg.env_vars.A B"].message
    assert "set by hpcrl" in errors["profile[site].env.HPCRL_RUN_DIR"].message
    assert "also has a value in env" in errors["profile[site].pass_env[0]"].message
    assert "shell identifier" in errors["profile[site].pass_env[1]"].message


def test_env_values_with_dollar_warn_that_they_stay_literal():
    spec = make_plan(
        automodel_recipe(num_nodes=2), pyxis_profile(env={"HF_HOME": "/lustre/hf", "X": "$USER"})
    )
    assert "not expanded" in warnings_of(spec)["profile[site].env.X"].message


def test_ray_ports_must_be_distinct_and_outside_the_worker_range():
    profile = pyxis_profile(
        ray_ports=RayPortsCfg(
            gcs_port=6800,
            node_manager_port=6800,
            dashboard_port=11500,
            torch_master_port=80,
            min_worker_port=11000,
            max_worker_port=12999,
        )  # fmt: skip
    )
    errors = plan_errors(automodel_recipe(num_nodes=2), profile)
    assert "same port as" in errors["profile[site].ray_ports.node_manager_port"].message
    assert "worker port range" in errors["profile[site].ray_ports.dashboard_port"].message
    assert "1024-65535" in errors["profile[site].ray_ports.torch_master_port"].message
