"""Each recipe rule: the valid case passes, the invalid case names full path, value and fix."""

import pytest

from hpcrl.config import structure_recipe
from hpcrl.config.megatron_rules import megatron_recompute
from hpcrl.config.override_rules import FIRST_CLASS_MODEL_OVERRIDES
from hpcrl.config.rules import MODEL_OVERRIDES_CHECKED_IN_JOB, check_recipe, provider_field_problems
from tests.recipe_builder import base_dict, paths, problems_for, with_keys

M = "policy.megatron_cfg"
OPT = "policy.megatron_cfg.optimizer"


def only(problems, severity="error"):
    chosen = [problem for problem in problems if problem.severity == severity]
    assert len(chosen) == 1, [problem.format() for problem in problems]
    return chosen[0]


# --------------------------------------------------------------------------- backend / algorithm
@pytest.mark.parametrize("megatron, automodel", [(True, True), (False, False)])
def test_exactly_one_backend_names_both_keys(megatron, automodel):
    problem = only(
        problems_for(
            policy__megatron_cfg__enabled=megatron, policy__automodel_cfg__enabled=automodel
        )
    )
    assert problem.path == "policy.megatron_cfg.enabled"
    assert "policy.megatron_cfg.enabled=true or policy.automodel_cfg.enabled=true" in problem.fix


@pytest.mark.parametrize("backend", ["megatron", "automodel"])
def test_one_backend_enabled_passes(backend):
    assert problems_for(backend) == []


def test_settings_under_disabled_megatron_are_ignored():
    broken_megatron = {
        "enabled": False,
        "tensor_model_parallel_size": 0,
        "manual_gc_interval": True,
        "offload_modules": ["nonsense"],
        "model_overrides": {"tensor_model_parallel_size": 2},
        "checkpoint": {"parallel_read_threads": 0},
        "optimizer": {
            "optimizer": "lamb",
            "optimizer_cpu_offload": True,
            "optimizer_offload_fraction": 7.0,
        },
    }
    assert problems_for("automodel", policy__megatron_cfg=broken_megatron) == []


def test_exactly_one_algorithm():
    both = with_keys(base_dict(), sft={})
    assert "exactly one algorithm" in only(check_recipe(structure_recipe(both))).message
    neither = base_dict()
    del neither["grpo"]
    assert only(check_recipe(structure_recipe(neither))).path == "<top>"
    assert problems_for(algorithm="sft") == []


# --------------------------------------------------------------------------- optimizer offload
@pytest.mark.parametrize("offload", [True, False])
@pytest.mark.parametrize("fraction", [-0.5, 1.5])
def test_offload_fraction_outside_zero_one_is_the_fields_own_bound(fraction, offload):
    """[0, 1] is declared beside the field: one error whether offload is on or off (the
    "has no effect" warning is only for a value the field could hold)."""
    (problem,) = problems_for(
        policy__megatron_cfg__optimizer={
            "optimizer_cpu_offload": offload,
            "optimizer_offload_fraction": fraction,
        }
    )
    assert (problem.path, problem.value, problem.severity) == (
        f"{OPT}.optimizer_offload_fraction",
        fraction,
        "error",
    )
    assert problem.message == "must be in [0, 1]: the share of optimizer state kept on the CPU"
    assert problem.fix == f"set {OPT}.optimizer_offload_fraction to e.g. 0.5 or 1.0"


def test_offload_fraction_zero_with_offload_on_is_refused_by_the_fields_own_bound():
    problem = only(
        problems_for(
            policy__megatron_cfg__optimizer={
                "optimizer_cpu_offload": True,
                "optimizer_offload_fraction": 0.0,
            }
        )
    )
    assert (problem.path, problem.value) == (f"{OPT}.optimizer_offload_fraction", 0.0)
    assert problem.message.startswith(f"must be above 0 when {OPT}.optimizer_cpu_offload is true")
    assert f"{OPT}.optimizer_cpu_offload=false" in problem.fix


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_offload_fraction_inside_zero_one(fraction):
    assert (
        problems_for(
            policy__megatron_cfg__optimizer={
                "optimizer_cpu_offload": True,
                "optimizer_offload_fraction": fraction,
            }
        )
        == []
    )


def test_offload_needs_distributed_optimizer():
    optimizer = {
        "optimizer_cpu_offload": True,
        "optimizer_offload_fraction": 0.5,
        "use_distributed_optimizer": False,
    }
    problem = only(problems_for(policy__megatron_cfg__optimizer=optimizer))
    assert problem.path == f"{OPT}.use_distributed_optimizer"
    assert f"{OPT}.use_distributed_optimizer=true" in problem.fix


def test_megatron_optimizer_is_adam_or_sgd():
    optimizer = {
        "optimizer": "adamw",
        "optimizer_cpu_offload": True,
        "optimizer_offload_fraction": 0.5,
    }
    problem = only(problems_for(policy__megatron_cfg__optimizer=optimizer))
    assert (problem.path, problem.value) == (f"{OPT}.optimizer", "adamw")
    assert "did you mean adam?" in problem.fix
    assert (
        problems_for(
            policy__megatron_cfg__optimizer={
                "optimizer": "sgd",
                "optimizer_cpu_offload": True,
                "optimizer_offload_fraction": 1.0,
            }
        )
        == []
    )


def test_offload_fraction_without_offload_is_a_warning():
    problems = problems_for(policy__megatron_cfg__optimizer={"optimizer_offload_fraction": 0.5})
    assert paths(problems) == [] and paths(problems, "warning") == [
        f"{OPT}.optimizer_offload_fraction"
    ]


# --------------------------------------------------------------------------- manual GC
@pytest.mark.parametrize("interval", [True, 0, -3, "10", 2.5, None])
def test_manual_gc_needs_positive_int_interval(interval):
    problem = only(
        problems_for(
            policy__megatron_cfg__manual_gc=True, policy__megatron_cfg__manual_gc_interval=interval
        )
    )
    assert problem.path == f"{M}.manual_gc_interval" and problem.value == interval
    assert "positive integer" in problem.message and f"{M}.manual_gc_interval=" in problem.fix


def test_bool_interval_is_named_as_a_boolean():
    problem = only(
        problems_for(
            policy__megatron_cfg__manual_gc=True, policy__megatron_cfg__manual_gc_interval=True
        )
    )
    assert "got a boolean (true/false is not a number of steps)" in problem.message


def test_manual_gc_with_positive_interval_passes():
    assert (
        problems_for(
            policy__megatron_cfg__manual_gc=True, policy__megatron_cfg__manual_gc_interval=10
        )
        == []
    )


def test_manual_gc_is_checked_for_automodel_too_since_its_workers_read_it():
    problem = only(
        problems_for("automodel", policy__megatron_cfg={"manual_gc": True, "manual_gc_interval": 0})
    )
    assert problem.path == f"{M}.manual_gc_interval"


def section_problems(section, backend="megatron", **content):
    """Problems of a recipe with a value/teacher section, less the section's own rejection
    (nothing trains with them yet), which is asserted here once."""
    problems = problems_for(backend, **{section: content})
    rejection = [p for p in problems if p.path == section]
    assert len(rejection) == 1 and "not supported yet" in rejection[0].message
    return [p for p in problems if p.path != section]


def test_value_model_takes_the_same_manual_gc_rule():
    bad_value = {"manual_gc": True, "manual_gc_interval": False}
    problem = only(section_problems("value", "automodel", megatron_cfg=bad_value))
    assert problem.path == "value.megatron_cfg.manual_gc_interval"
    good_value = {"manual_gc": True, "manual_gc_interval": 5}
    assert section_problems("value", "automodel", megatron_cfg=good_value) == []


@pytest.mark.parametrize("key", ["manual_gc", "manual_gc_interval"])
def test_teacher_overrides_reject_manual_gc(key):
    overrides = {key: 5 if key.endswith("interval") else True}
    problem = only(section_problems("teacher", megatron_cfg_overrides=overrides))
    assert problem.path == f"teacher.megatron_cfg_overrides.{key}"
    assert f"{M}.{key}" in problem.fix


def test_teacher_overrides_keys_are_megatron_fields_with_did_you_mean():
    overrides = {"tensor_model_paralel_size": 2, "optimizer": {"lr": "fast"}}
    problems = section_problems("teacher", megatron_cfg_overrides=overrides)
    assert sorted(paths(problems)) == [
        "teacher.megatron_cfg_overrides.optimizer.lr",
        "teacher.megatron_cfg_overrides.tensor_model_paralel_size",
    ]
    typo = next(p for p in problems if p.path.endswith("paralel_size"))
    assert "did you mean teacher.megatron_cfg_overrides.tensor_model_parallel_size?" in typo.fix


def test_valid_teacher_overrides_pass():
    overrides = {"tensor_model_parallel_size": 4}
    assert section_problems("teacher", model_name="big", megatron_cfg_overrides=overrides) == []


# --------------------------------------------------------------------------- fine-grained offload
def fgao(modules, **extra):
    return problems_for(
        policy__megatron_cfg={
            "enabled": True,
            "fine_grained_activation_offloading": True,
            "offload_modules": modules,
            **extra,
        }
    )


def test_fine_grained_offload_valid_set_only_notes_transformer_engine():
    problems = fgao(["core_attn", "attn_proj", "mlp_norm"])
    assert paths(problems) == []
    assert "Transformer Engine" in only(problems, "warning").message


def test_unknown_offload_module_suggests_the_name():
    problem = only(fgao(["core_attn", "core_atn"]))
    assert (problem.path, problem.value) == (f"{M}.offload_modules[1]", "core_atn")
    assert "did you mean core_attn?" in problem.fix


def test_fine_grained_offload_needs_modules():
    problem = only(fgao([]))
    assert problem.path == f"{M}.offload_modules" and "is empty" in problem.message
    assert "Transformer Engine" in problem.fix


def test_attn_proj_needs_core_attn():
    problem = only(fgao(["attn_proj"]))
    assert "attn_proj needs core_attn" in problem.message and "add core_attn" in problem.fix


@pytest.mark.parametrize("other", ["expert_fc1", "moe_act"])
def test_fused_group_mlp_excludes_expert_modules(other):
    problem = only(fgao(["fused_group_mlp", other]))
    assert "fused_group_mlp" in problem.message and problem.value == sorted(
        ["fused_group_mlp", other]
    )


@pytest.mark.parametrize("module", ["expert_fc1", "moe_act", "fused_group_mlp"])
def test_moe_recompute_conflicts_with_moe_offload(module):
    problem = only(fgao([module], recompute_modules=["moe"]))
    assert problem.path == f"{M}.recompute_modules" and problem.value == ["moe"]
    assert fgao([module], recompute_modules=["core_attn"]) == fgao([module])


def test_layer_level_cpu_offloading_conflicts():
    problem = only(fgao(["core_attn"], cpu_offloading=True))
    assert problem.path == f"{M}.cpu_offloading" and f"{M}.cpu_offloading=false" in problem.fix


def test_local_cuda_graphs_allow_only_moe_modules():
    problem = only(fgao(["expert_fc1", "qkv_linear"], cuda_graph_impl="local"))
    assert "['qkv_linear']" in problem.message
    assert paths(fgao(["expert_fc1", "moe_act"], cuda_graph_impl="local")) == []
    assert paths(fgao(["qkv_linear"], cuda_graph_impl="transformer_engine")) == []


def test_offload_modules_without_the_switch_are_a_warning():
    problems = problems_for(policy__megatron_cfg__offload_modules=["core_attn"])
    assert paths(problems) == [] and paths(problems, "warning") == [f"{M}.offload_modules"]


# --------------------------------------------------------------------------- model_overrides
@pytest.mark.parametrize(
    "key, target",
    [
        ("tensor_model_parallel_size", f"{M}.tensor_model_parallel_size"),
        ("sequence_parallel", f"{M}.sequence_parallel"),
        ("recompute_granularity", f"{M}.recompute_granularity"),
        ("cpu_offloading_activations", f"{M}.cpu_offloading"),
        ("offload_modules", f"{M}.offload_modules"),
        ("cuda_graph_impl", f"{M}.cuda_graph_impl"),
        ("bf16", "policy.precision"),
        ("force_reconvert_from_hf", f"{M}.force_reconvert_from_hf"),
    ],
)
def test_model_override_duplicating_first_class_field_names_the_field(key, target):
    problem = only(
        problems_for(policy__megatron_cfg__model_overrides={key: 1, "hidden_dropout": 0.0})
    )
    assert problem.path == f"{M}.model_overrides.{key}"
    assert problem.fix.startswith(f"set {target} instead")


def test_first_class_table_points_at_real_fields():
    from hpcrl.config.overrides import check_key_in_schema
    from hpcrl.config.recipe import Recipe

    for target in FIRST_CLASS_MODEL_OVERRIDES.values():
        assert check_key_in_schema(tuple(target.split(".")), Recipe, target) is None, target


def test_provider_fields_are_left_to_the_job_with_a_helper():
    assert (
        problems_for(
            policy__megatron_cfg__model_overrides={"hidden_dropout": 0.0, "rotary_base": 1e6}
        )
        == []
    )
    assert "provider_field_problems" in MODEL_OVERRIDES_CHECKED_IN_JOB
    problems = provider_field_problems(
        {"hiden_dropout": 0.0, "rotary_base": 1e6}, {"hidden_dropout", "rotary_base"}
    )
    problem = only(problems)
    assert problem.path == f"{M}.model_overrides.hiden_dropout"
    assert "did you mean policy.megatron_cfg.model_overrides.hidden_dropout?" in problem.fix


# --------------------------------------------------------------------------- sizes and threads
@pytest.mark.parametrize("threads, ok", [(1, True), (8, True), (0, False), (-1, False)])
def test_parallel_read_threads_positive(threads, ok):
    problems = problems_for(policy__megatron_cfg__checkpoint={"parallel_read_threads": threads})
    if ok:
        assert problems == []
    else:
        problem = only(problems)
        assert (problem.path, problem.value) == (f"{M}.checkpoint.parallel_read_threads", threads)
        assert "=1 (PyTorch's own reader)" in problem.fix


@pytest.mark.parametrize(
    "name", ["dp_replicate_size", "tensor_parallel_size", "context_parallel_size"]
)
def test_automodel_parallel_sizes_at_least_one(name):
    problem = only(problems_for("automodel", **{f"policy__automodel_cfg__{name}": 0}))
    assert problem.path == f"policy.automodel_cfg.{name}" and problem.value == 0
    assert problems_for("automodel", **{f"policy__automodel_cfg__{name}": 2}) == []


def test_megatron_parallel_sizes_at_least_one():
    problem = only(problems_for(policy__megatron_cfg__pipeline_model_parallel_size=0))
    assert problem.path == f"{M}.pipeline_model_parallel_size"


# --------------------------------------------------------------------------- batches and GRPO
def test_global_batch_divisible_by_micro_batch():
    problem = only(
        problems_for(policy__train_global_batch_size=8, policy__train_micro_batch_size=3)
    )
    assert problem.path == "policy.train_global_batch_size" and "e.g. 9" in problem.fix


def test_global_batch_divides_grpo_rollouts():
    # 4 prompts x 2 generations = 8 rollouts: 8 and 4 divide them, 6 does not
    assert problems_for(policy__train_global_batch_size=4) == []
    problem = only(
        problems_for(policy__train_global_batch_size=6, policy__train_micro_batch_size=3)
    )
    assert "= 8" in problem.message and "policy.train_global_batch_size=8" in problem.fix


def test_counts_must_be_positive():
    problem = only(problems_for(grpo__num_generations_per_prompt=0))
    assert problem.path == "grpo.num_generations_per_prompt"


def test_leave_one_out_needs_two_generations():
    problem = only(
        problems_for(
            grpo={
                "num_prompts_per_step": 8,
                "num_generations_per_prompt": 1,
                "use_leave_one_out_baseline": True,
            }
        )
    )
    assert problem.path == "grpo.num_generations_per_prompt"


# One node of cluster.gpus_per_node 8: 4 GPUs for generation, 4 for training (NeMo RL's split).
SEPARATE_VLLM = {
    "backend": "vllm",
    "colocated": {"enabled": False, "resources": {"num_nodes": None, "gpus_per_node": 4}},
}


def test_async_grpo_needs_importance_sampling_correction():
    problem = only(
        problems_for(grpo__async_grpo={"enabled": True}, policy__generation=SEPARATE_VLLM)
    )
    assert problem.path == "loss_fn.use_importance_sampling_correction"
    assert "loss_fn.use_importance_sampling_correction=true" in problem.fix
    assert (
        problems_for(
            grpo__async_grpo={"enabled": True},
            loss_fn={"use_importance_sampling_correction": True},
            policy__generation=SEPARATE_VLLM,
        )
        == []
    )


@pytest.mark.parametrize(
    "generation, bad_path",
    [
        ({"backend": "torch"}, "policy.generation.backend"),
        ({"backend": "vllm"}, "policy.generation.colocated.enabled"),
    ],
)
def test_async_grpo_needs_vllm_on_separate_workers(generation, bad_path):
    problem = only(
        problems_for(
            grpo__async_grpo={"enabled": True},
            loss_fn={"use_importance_sampling_correction": True},
            policy__generation=generation,
        )
    )
    assert problem.path == bad_path
    assert "policy.generation.colocated.enabled=false" in problem.fix


def test_vllm_settings_checked_only_for_vllm():
    vllm = {"backend": "vllm", "vllm_cfg": {"gpu_memory_utilization": 1.5}}
    assert (
        only(problems_for(policy__generation=vllm)).path
        == "policy.generation.vllm_cfg.gpu_memory_utilization"
    )
    assert (
        problems_for(
            policy__generation={"backend": "torch", "vllm_cfg": {"gpu_memory_utilization": 1.5}}
        )
        == []
    )


def test_separate_generation_needs_its_resources():
    # The split itself (NeMo RL's rules): tests/config/test_node_split.py.
    problems = problems_for(policy__generation={"backend": "vllm", "colocated": {"enabled": False}})
    assert paths(problems) == ["policy.generation.colocated.resources.gpus_per_node"]


# --------------------------------------------------------------------------- parallel features
def test_megatron_sequence_parallel_needs_tensor_parallel():
    problem = only(problems_for(policy__megatron_cfg__sequence_parallel=True))
    assert (
        problem.path == f"{M}.sequence_parallel"
        and f"{M}.tensor_model_parallel_size" in problem.fix
    )
    assert (
        problems_for(
            policy__megatron_cfg__sequence_parallel=True,
            policy__megatron_cfg__tensor_model_parallel_size=2,
        )
        == []
    )


def test_expert_and_tensor_parallel_need_sequence_parallel():
    sizes = {"enabled": True, "tensor_model_parallel_size": 2, "expert_model_parallel_size": 2}
    assert only(problems_for(policy__megatron_cfg=sizes)).fix == f"set {M}.sequence_parallel=true"
    assert problems_for(policy__megatron_cfg={**sizes, "sequence_parallel": True}) == []


def test_recompute_is_keyed_on_activation_checkpointing():
    # NeMo RL's meaning: granularity, method and layers only matter when it is true.
    off = {"enabled": True, "recompute_granularity": "full", "recompute_method": "block"}
    problems = problems_for(policy__megatron_cfg=off)
    assert paths(problems) == []
    assert paths(problems, "warning") == [f"{M}.recompute_granularity", f"{M}.recompute_method"]
    assert "activation_checkpointing is false" in problems[0].message
    on = {"enabled": True, "activation_checkpointing": True}
    assert problems_for(policy__megatron_cfg=on) == []
    assert megatron_recompute(
        structure_recipe(with_keys(base_dict(), policy__megatron_cfg=on)).policy.megatron_cfg
    ) == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    }
    block = {**on, "recompute_method": "block", "recompute_num_layers": 4}
    cfg = structure_recipe(with_keys(base_dict(), policy__megatron_cfg=block)).policy.megatron_cfg
    assert megatron_recompute(cfg)["recompute_method"] == "block"
    assert megatron_recompute(cfg)["recompute_num_layers"] == 4
    bad = {**on, "recompute_num_layers": 0}
    assert only(problems_for(policy__megatron_cfg=bad)).path == f"{M}.recompute_num_layers"


def test_recompute_method_needs_full_granularity():
    selective = {
        "enabled": True,
        "activation_checkpointing": True,
        "recompute_granularity": "selective",
        "recompute_method": "block",
    }
    problem = only(problems_for(policy__megatron_cfg=selective))
    assert problem.path == f"{M}.recompute_method" and "(it is selective)" in problem.message


def test_automodel_sequence_parallel_is_accepted_with_tp_and_a_warning_without():
    """TP > 1: the Automodel plan splits the sequence across TP ranks (issue 24;
    tests/core/test_parallel_tp.py). TP 1: nothing to split across tensor-parallel ranks;
    NeMo RL's DTensor worker ignores it with a warning (its GSPO recipes set it so), and so
    does hpcrl."""
    overrides = {"enabled": True, "tensor_parallel_size": 2, "sequence_parallel": True}
    assert problems_for("automodel", policy__automodel_cfg=overrides) == []
    overrides["tensor_parallel_size"] = 1
    problem = only(problems_for("automodel", policy__automodel_cfg=overrides), "warning")
    assert problem.path == "policy.automodel_cfg.sequence_parallel" and not problem.is_error
    assert "no effect with tensor_parallel_size 1" in problem.message


def test_megatron_custom_fsdp_is_refused_at_load_time():
    problem = only(
        problems_for(policy__megatron_cfg__distributed_data_parallel_config__use_custom_fsdp=True)
    )
    assert problem.path == f"{M}.distributed_data_parallel_config.use_custom_fsdp"
    assert "use_distributed_optimizer=true" in problem.fix


def test_packing_algorithm_is_checked_only_while_packing_is_on():
    """NeMo RL reads it only then; its configs carry modified_ffd with packing off."""
    off = {"enabled": False, "algorithm": "modified_ffd"}
    assert problems_for(policy__sequence_packing=off) == []
    problem = only(problems_for(policy__sequence_packing={**off, "enabled": True}))
    assert (problem.path, problem.value) == ("policy.sequence_packing.algorithm", "modified_ffd")
    assert problem.fix.startswith("did you mean modified_first_fit_decreasing?")
