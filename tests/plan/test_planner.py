"""Pre-flight planning: allocation, layout, batch, Slurm bits, data files (checkpoint dir,
mounts, env and ports: test_planner_paths_env.py)."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config.errors import ConfigError
from hpcrl.config.profile import SlurmCfg
from hpcrl.config.recipe import DataCfg
from hpcrl.core.driver import training_layout
from hpcrl.job.settings import planned_settings
from tests.plan.planning_inputs import (
    GOLDEN_RUN_DIR,
    local_profile,
    make_plan,
    plain_slurm_profile,
    plan_errors,
    pyxis_profile,
    warnings_of,
)
from tests.recipe_builder import automodel_recipe, megatron_recipe, with_policy


# --------------------------------------------------------------------------- allocation
def test_more_gpus_per_node_than_the_profile_has_is_an_error():
    errors = plan_errors(automodel_recipe(num_nodes=1, gpus_per_node=16), pyxis_profile())
    assert errors["cluster.gpus_per_node"].format() == (
        "error: cluster.gpus_per_node = 16: the recipe wants 16 training ranks per node but "
        "profile 'site' offers 8 (gpus_per_node)\n"
        "  fix: set cluster.gpus_per_node to at most 8 and raise cluster.num_nodes instead, or "
        "use a profile whose gpus_per_node is 16 or more (profile[site].gpus_per_node)"
    )


def test_equal_gpus_per_node_request_the_whole_node_without_warning():
    spec = make_plan(automodel_recipe(num_nodes=2, gpus_per_node=8), pyxis_profile())
    assert (spec.slots_per_node, spec.world_size, dict(spec.sbatch_directives)["gres"]) == (
        8,
        16,
        "gpu:8",
    )
    assert "cluster.gpus_per_node" not in warnings_of(spec)


def test_fewer_gpus_per_node_request_only_those_and_warn():
    spec = make_plan(automodel_recipe(num_nodes=2, gpus_per_node=2), pyxis_profile())
    directives = dict(spec.sbatch_directives)
    assert (spec.slots_per_node, spec.world_size, directives["gres"]) == (2, 4, "gpu:2")
    assert (spec.layout.dp_shard, directives["nodes"], directives["cpus-per-task"]) == (
        4,
        "2",
        "112",  # the profile's CPUs: it sets them per node, not per GPU
    )
    # Ray starts each node with 2 GPUs and the trainer places 2 workers on each.
    assert planned_settings(spec)["num_gpus"] == 2
    layout = training_layout(spec)
    assert (layout.num_nodes, layout.workers_per_node) == (2, 2)
    warning = warnings_of(spec)["cluster.gpus_per_node"]
    assert (warning.name, warning.message, warning.fix) == (
        "allocation",
        "the recipe trains on 2 of the 8 GPUs per node of profile 'site' (gpus_per_node), so "
        "the job requests 2 per node; the other 6 of each node stay idle (slurm.exclusive: "
        "the job holds whole nodes)",
        "set cluster.gpus_per_node=8 to train on whole nodes, or set "
        "profile[site].slurm.exclusive: false to leave them to other jobs",
    )


def test_fewer_gpus_per_node_on_shared_nodes_leave_the_rest_to_other_jobs():
    slurm = SlurmCfg(account="acct", gres_form="gpus_per_node", exclusive=False)
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=1), pyxis_profile(slurm=slurm))
    directives = dict(spec.sbatch_directives)
    assert (directives["gpus-per-node"], "gres" in directives, "exclusive" in directives) == (
        "1",
        False,
        False,
    )
    warning = warnings_of(spec)["cluster.gpus_per_node"]
    assert warning.message.endswith("; the other 7 of each node are left to other jobs")
    assert warning.fix == "set cluster.gpus_per_node=8 to train on whole nodes"


def test_fewer_worker_slots_on_a_local_cpu_profile():
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=1), local_profile())
    assert (spec.slots_per_node, spec.world_size, spec.sbatch_directives) == (1, 1, ())
    assert warnings_of(spec)["cluster.gpus_per_node"].message == (
        "the recipe trains on 1 of the 2 CPU worker slots per node of profile 'local' "
        "(worker_slots_per_node), so the job requests 1 per node; the other 1 of this machine "
        "stay free for other work"
    )


def test_tp_beyond_the_training_ranks_of_a_node_warns():
    recipe = megatron_recipe(num_nodes=2, gpus_per_node=2, tensor_model_parallel_size=4)
    warning = warnings_of(
        make_plan(with_policy(recipe, train_global_batch_size=8), pyxis_profile())
    )["policy.megatron_cfg.tensor_model_parallel_size"]
    assert "spans nodes of 2 training ranks each" in warning.message


def test_cpu_profile_counts_worker_slots():
    errors = plan_errors(automodel_recipe(num_nodes=1, gpus_per_node=8), local_profile())
    assert "worker_slots_per_node" in errors["cluster.gpus_per_node"].fix
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=2), local_profile())
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size) == (1, 2, 2)


def test_local_profile_rejects_several_nodes():
    errors = plan_errors(automodel_recipe(num_nodes=2, gpus_per_node=2), local_profile())
    assert errors["cluster.num_nodes"].value == 2
    assert "cluster.num_nodes=1" in errors["cluster.num_nodes"].fix


# --------------------------------------------------------------------------- layout
def test_automodel_layout_derives_dp_shard():
    spec = make_plan(
        automodel_recipe(num_nodes=2, dp_replicate_size=2, tensor_parallel_size=2), pyxis_profile()
    )
    layout = spec.layout
    assert (layout.dp_replicate, layout.dp_shard, layout.tp, layout.cp) == (2, 4, 2, 1)
    assert layout.dp == 8
    assert layout.describe() == "dp_replicate=2 × dp_shard=4 × tp=2 × cp=1"


def test_automodel_layout_that_does_not_factor_lists_valid_products():
    errors = plan_errors(automodel_recipe(num_nodes=2, tensor_parallel_size=3), pyxis_profile())
    problem = errors["policy.automodel_cfg.tensor_parallel_size"]
    assert problem.value == 3
    assert "does not divide the world size 16" in problem.message
    assert "[1, 2, 4, 8, 16]" in problem.fix


def test_megatron_layout_and_expert_rule():
    spec = make_plan(
        megatron_recipe(
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=2,
            expert_model_parallel_size=4,
        ),
        pyxis_profile(),
    )
    assert (spec.layout.tp, spec.layout.pp, spec.layout.cp, spec.layout.dp, spec.layout.ep) == (
        2,
        2,
        1,
        4,
        4,
    )
    # 16 ranks / pp 2 = 8 per stage; ep 3 cannot tile them.
    errors = plan_errors(
        megatron_recipe(pipeline_model_parallel_size=2, expert_model_parallel_size=3),
        pyxis_profile(),
    )
    problem = errors["policy.megatron_cfg.expert_model_parallel_size"]
    assert "= 8" in problem.message
    assert "[1, 2, 4, 8]" in problem.fix


def test_megatron_model_parallel_must_divide_world():
    errors = plan_errors(
        megatron_recipe(tensor_model_parallel_size=8, context_parallel_size=3), pyxis_profile()
    )
    assert "policy.megatron_cfg.context_parallel_size" in errors


def test_hsdp_warns_when_shard_groups_cross_nodes():
    recipe = automodel_recipe(num_nodes=4, dp_replicate_size=2)
    recipe = with_policy(recipe, train_global_batch_size=64)
    spec = make_plan(recipe, pyxis_profile())
    warning = warnings_of(spec)["policy.automodel_cfg.dp_replicate_size"]
    assert "16 ranks spans nodes" in warning.message
    assert "[4, 8, 16, 32]" in warning.fix
    spec = make_plan(automodel_recipe(num_nodes=2, dp_replicate_size=2), pyxis_profile())
    assert not spec.warnings
    assert any(check.name == "hsdp" and check.status == "passed" for check in spec.checks)


def test_tp_larger_than_a_node_warns():
    recipe = with_policy(megatron_recipe(tensor_model_parallel_size=16), train_global_batch_size=8)
    warning = warnings_of(make_plan(recipe, pyxis_profile()))[
        "policy.megatron_cfg.tensor_model_parallel_size"
    ]
    assert "≤ 8" in warning.fix


def test_global_batch_must_split_into_dp_and_micro_batches():
    recipe = with_policy(
        automodel_recipe(num_nodes=2), train_global_batch_size=40, train_micro_batch_size=2
    )
    problem = plan_errors(recipe, pyxis_profile())["policy.train_global_batch_size"]
    assert problem.value == 40
    assert "dp (16) × policy.train_micro_batch_size (2) = 32" in problem.message
    assert "multiple of 32 (e.g. 32 or 64)" in problem.fix


def test_all_errors_are_reported_together():
    recipe = with_policy(automodel_recipe(num_nodes=2), train_global_batch_size=3)
    profile = pyxis_profile(env={"HF_HOME": "/scratch/hf", "bad-name": "x"}, pass_env=("9LIVES",))
    errors = plan_errors(recipe, profile)
    assert {
        "policy.train_global_batch_size",
        "profile[site].container.mounts",
        "profile[site].env.bad-name",
        "profile[site].pass_env[0]",
    } <= set(errors)


# --------------------------------------------------------------------------- Slurm and submitit bits
def test_sbatch_directives_are_sorted_and_complete():
    spec = make_plan(automodel_recipe(num_nodes=2), pyxis_profile())
    assert spec.sbatch_directives == (
        ("account", "acct"),
        ("cpus-per-task", "112"),
        ("error", f"{GOLDEN_RUN_DIR}/submitit/%j_0_log.err"),
        ("exclusive", None),
        ("gres", "gpu:8"),
        ("job-name", "grpo-test-2n8g"),
        ("nodes", "2"),
        ("ntasks-per-node", "1"),
        ("open-mode", "append"),
        ("output", f"{GOLDEN_RUN_DIR}/submitit/%j_0_log.out"),
        ("partition", "batch"),
        ("requeue", None),
        ("signal", "USR2@90"),
        ("time", "04:00:00"),
    )


def test_gres_forms_and_cpu_profiles():
    slurm = SlurmCfg(gres_form="gpus_per_node", exclusive=False, mem_gb=512)
    directives = dict(
        make_plan(automodel_recipe(num_nodes=2), pyxis_profile(slurm=slurm)).sbatch_directives
    )
    assert directives["gpus-per-node"] == "8" and "gres" not in directives
    assert directives["mem"] == "512G" and "exclusive" not in directives
    cpu = dict(
        make_plan(
            automodel_recipe(num_nodes=2, gpus_per_node=2), plain_slurm_profile()
        ).sbatch_directives
    )
    assert "gres" not in cpu and "gpus-per-node" not in cpu


def test_array_jobs_use_submitit_array_log_names():
    spec = make_plan(automodel_recipe(num_nodes=2), pyxis_profile(), array_size=6)
    directives = dict(spec.sbatch_directives)
    assert directives["array"] == "0-5%4"
    assert directives["output"] == f"{GOLDEN_RUN_DIR}/submitit/%A_%a_0_log.out"
    assert spec.stdout_path == f"{GOLDEN_RUN_DIR}/submitit/%A_%a_%t_log.out"
    assert (spec.array_size, spec.array_parallelism) == (6, 4)


def test_extra_sbatch_args_are_checked():
    slurm = SlurmCfg(sbatch_args=("--reservation=r1", "--time=10:00", "-p x", "--constraint=a\nb"))
    profile = pyxis_profile(slurm=slurm)
    errors = plan_errors(automodel_recipe(num_nodes=2), profile)
    assert "slurm.time_limit" in errors["profile[site].slurm.sbatch_args[1]"].fix
    assert {"profile[site].slurm.sbatch_args[2]", "profile[site].slurm.sbatch_args[3]"} <= set(
        errors
    )
    ok = make_plan(
        automodel_recipe(num_nodes=2),
        pyxis_profile(slurm=SlurmCfg(sbatch_args=("--reservation=r1", "--hold"))),
    )
    assert ("reservation", "r1") in ok.sbatch_directives and ("hold", None) in ok.sbatch_directives


def test_task_command_is_submitits_through_the_bundle_entry():
    spec = make_plan(automodel_recipe(num_nodes=2), pyxis_profile())
    entry = "/runs/.hpcrl-bundles/hpcrl-0.1.0-0123456789abcdef/hpcrl_entry.py"
    # In a container through /usr/bin/env: srun resolves a command on the host first.
    assert spec.task_command == (
        f"/usr/bin/env /opt/venv/bin/python {entry} -u -m submitit.core._submit "
        f"{GOLDEN_RUN_DIR}/submitit"
    )
    assert spec.python_command == f"/usr/bin/env /opt/venv/bin/python {entry}"
    assert spec.srun_args[:5] == (
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        f"--output={GOLDEN_RUN_DIR}/submitit/%j_%t_log.out",
        f"--error={GOLDEN_RUN_DIR}/submitit/%j_%t_log.err",
    )
    assert "--no-container-mount-home" in spec.srun_args
    assert spec.signal == "USR2@90"


def test_local_plans_have_no_slurm_parts():
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=2), local_profile())
    assert spec.sbatch_directives == () and spec.srun_args == () and spec.container is None
    assert spec.scheduler == "local"


def test_plans_are_equal_for_equal_inputs():
    first = make_plan(megatron_recipe(), pyxis_profile(), overrides=["a=1"])
    second = make_plan(megatron_recipe(), pyxis_profile(), overrides=["a=1"])
    assert first == second
    assert attrs.evolve(first, job_name="other") != second


def test_a_missing_data_file_is_an_error_before_the_queue(tmp_path):
    recipe = attrs.evolve(
        automodel_recipe(num_nodes=2, gpus_per_node=1),
        data=DataCfg(train_path=str(tmp_path / "nope.jsonl")),
    )
    with pytest.raises(ConfigError) as caught:
        make_plan(recipe, plain_slurm_profile())
    (problem,) = [p for p in caught.value.errors if p.path == "data.train_path"]
    assert problem.message == "no such file"
    assert "relative to the recipe's folder" in problem.fix
    recipe = attrs.evolve(recipe, data=DataCfg(train_path=str(tmp_path)))
    with pytest.raises(ConfigError, match="a folder, not a data file"):
        make_plan(recipe, plain_slurm_profile())


def test_a_data_file_in_a_container_is_checked_at_its_mount(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"prompt": "p", "answer": "1"}\n')
    container = attrs.evolve(
        pyxis_profile().container, mounts=(f"{tmp_path}:/data", "/lustre:/lustre")
    )
    profile = pyxis_profile(container=container)
    ok = attrs.evolve(automodel_recipe(), data=DataCfg(train_path="/data/train.jsonl"))
    assert any(check.name == "data_files" for check in make_plan(ok, profile).checks)
    missing = attrs.evolve(ok, data=DataCfg(train_path="/data/nope.jsonl"))
    with pytest.raises(
        ConfigError, match=rf"no such file \(on this machine: {tmp_path}/nope.jsonl\)"
    ):
        make_plan(missing, profile)
    in_image = attrs.evolve(ok, data=DataCfg(train_path="/opt/image/train.jsonl"))
    make_plan(in_image, profile)  # only the job can see it


def test_data_that_runs_out_before_max_num_steps_is_a_warning_with_the_numbers(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"prompt": "p{i}", "answer": "{i}"}}\n' for i in range(20)) + "\n")
    recipe = attrs.evolve(
        automodel_recipe(),
        data=DataCfg(train_path=str(data)),
        grpo=attrs.evolve(automodel_recipe().grpo, max_num_steps=12, max_num_epochs=1),
    )
    warning = warnings_of(make_plan(recipe, pyxis_profile(container=None)))["grpo.max_num_steps"]
    assert warning.message == (
        "asks for 12 steps, but the data gives 2: train.jsonl holds 20 rows, at 8 per step "
        "(grpo.num_prompts_per_step) over 1 epoch(s) (grpo.max_num_epochs) that is 2 steps; "
        "the run stops after step 2"
    )
    assert warning.fix.startswith("set grpo.max_num_epochs=5 to pass over the data that often")
    assert "or grpo.max_num_steps=2, or give more data" in warning.fix
    # The fix it names is enough: no warning then (5 epochs of 20 rows = 12 steps of 8).
    enough = attrs.evolve(recipe, grpo=attrs.evolve(recipe.grpo, max_num_epochs=5))
    assert "grpo.max_num_steps" not in warnings_of(make_plan(enough, pyxis_profile(container=None)))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # /etc/shadow's shape: it used to be accepted ("holds 27 rows") and fail in the job
        ("root:*:19000:0:99999:7:::\nalice:$6$salt$hash:19000:0:99999:7:::\n",
         "line 1 of train.jsonl is not JSON: a data file is JSONL, one JSON object per line"),
        ('{"prompt": "p", "answer": "1"}\n["p", "1"]\n',
         "line 2 of train.jsonl is a JSON list, not an object (one per line)"),
        ('{"prompt": "p", "answer": "1"}\n{"prompt": "secret text"}\n',
         'line 2 of train.jsonl has no "answer": the job reads prompt, answer from every row'),
    ],
    ids=["shadow-shaped", "a-list", "no-answer"],
)  # fmt: skip
def test_a_data_file_that_is_not_the_jobs_jsonl_is_an_error_naming_the_line(
    tmp_path, text, message
):
    data = tmp_path / "train.jsonl"
    data.write_text(text)
    recipe = attrs.evolve(automodel_recipe(), data=DataCfg(train_path=str(data)))
    with pytest.raises(ConfigError) as caught:
        make_plan(recipe, pyxis_profile(container=None))
    (problem,) = [p for p in caught.value.errors if p.path == "data.train_path"]
    assert problem.message == message
    assert "alice" not in problem.format() and "secret" not in problem.format()  # never the rows
