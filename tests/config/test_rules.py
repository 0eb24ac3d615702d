"""Each recipe rule: the valid case passes, the invalid case names full path, value and fix
(the Megatron rules: test_megatron_rules.py)."""

import pytest

from hpcrl.config import structure_recipe
from hpcrl.config.megatron_rules import megatron_recompute
from hpcrl.config.rules import check_recipe
from tests.recipe_builder import base_dict, only, paths, problems_for, with_keys

M = "policy.megatron_cfg"
OPT = "policy.megatron_cfg.optimizer"


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
