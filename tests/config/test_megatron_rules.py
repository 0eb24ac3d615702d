"""Each Megatron recipe rule (optimizer offload, manual GC, fine-grained activation offload,
model_overrides): the valid case passes, the invalid case names full path, value and fix
(the other rules: test_rules.py)."""

import pytest

from hpcrl.config.override_rules import FIRST_CLASS_MODEL_OVERRIDES
from hpcrl.config.rules import MODEL_OVERRIDES_CHECKED_IN_JOB, provider_field_problems
from tests.recipe_builder import only, paths, problems_for

M = "policy.megatron_cfg"
OPT = "policy.megatron_cfg.optimizer"


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
