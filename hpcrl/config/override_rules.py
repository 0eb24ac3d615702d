"""Rules for the free-form Megatron mappings: ``policy.megatron_cfg.model_overrides`` and a
distillation teacher's ``teacher.megatron_cfg_overrides``.

model_overrides keys that duplicate a first-class recipe field are rejected here; whether the
others are real provider fields is checked in the job (see MODEL_OVERRIDES_CHECKED_IN_JOB).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hpcrl.config.converter import try_structure, unstructure
from hpcrl.config.deep_merge import deep_merge
from hpcrl.config.errors import Problem
from hpcrl.config.megatron_rules import MEGATRON, megatron_enabled
from hpcrl.config.recipe import MegatronCfg, Recipe
from hpcrl.config.suggestions import did_you_mean

TEACHER_REJECTED_KEYS = ("manual_gc", "manual_gc_interval")

# model_overrides keys that a first-class recipe field already controls: provider field →
# the recipe key to set instead. Every MegatronCfg field name is rejected as well.
FIRST_CLASS_MODEL_OVERRIDES: Mapping[str, str] = {
    "tensor_model_parallel_size": f"{MEGATRON}.tensor_model_parallel_size",
    "pipeline_model_parallel_size": f"{MEGATRON}.pipeline_model_parallel_size",
    "context_parallel_size": f"{MEGATRON}.context_parallel_size",
    "expert_model_parallel_size": f"{MEGATRON}.expert_model_parallel_size",
    "expert_tensor_parallel_size": f"{MEGATRON}.expert_tensor_parallel_size",
    "num_layers_in_first_pipeline_stage": f"{MEGATRON}.num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage": f"{MEGATRON}.num_layers_in_last_pipeline_stage",
    "pipeline_dtype": f"{MEGATRON}.pipeline_dtype",
    "sequence_parallel": f"{MEGATRON}.sequence_parallel",
    "recompute_granularity": f"{MEGATRON}.recompute_granularity",
    "recompute_method": f"{MEGATRON}.recompute_method",
    "recompute_num_layers": f"{MEGATRON}.recompute_num_layers",
    "recompute_modules": f"{MEGATRON}.recompute_modules",
    "cpu_offloading": f"{MEGATRON}.cpu_offloading",
    "cpu_offloading_num_layers": f"{MEGATRON}.cpu_offloading_num_layers",
    "cpu_offloading_activations": f"{MEGATRON}.cpu_offloading",
    "cpu_offloading_weights": f"{MEGATRON}.cpu_offloading",
    "fine_grained_activation_offloading": f"{MEGATRON}.fine_grained_activation_offloading",
    "offload_modules": f"{MEGATRON}.offload_modules",
    "cuda_graph_impl": f"{MEGATRON}.cuda_graph_impl",
    "enable_cuda_graph": f"{MEGATRON}.cuda_graph_impl",
    "apply_rope_fusion": f"{MEGATRON}.apply_rope_fusion",
    "bias_activation_fusion": f"{MEGATRON}.bias_activation_fusion",
    "moe_router_freeze": f"{MEGATRON}.freeze_moe_router",
    "bf16": "policy.precision",
    "fp16": "policy.precision",
    "params_dtype": "policy.precision",
    "seq_length": "policy.max_total_sequence_length",
    "manual_gc": f"{MEGATRON}.manual_gc",
    "manual_gc_interval": f"{MEGATRON}.manual_gc_interval",
}


# --------------------------------------------------------------------------- model_overrides
def rule_model_overrides_first_class(recipe: Recipe) -> list[Problem]:
    """Reject model_overrides keys that duplicate first-class fields (see MODEL_OVERRIDES_CHECKED_IN_JOB)."""
    if not megatron_enabled(recipe):
        return []
    return [
        Problem(
            path=f"{MEGATRON}.model_overrides.{key}",
            value=value,
            message="duplicates a first-class recipe key; model_overrides is for provider fields the recipe does not have",
            fix=f"set {target} instead and remove {MEGATRON}.model_overrides.{key}",
        )
        for key, value in recipe.policy.megatron_cfg.model_overrides.items()
        if (target := first_class_target(key)) is not None
    ]


# Provider fields that change how megatron-core scales the loss: hpcrl's step already
# normalises by the global token count and scales for micro-batches × DP.
LOSS_SCALING_OVERRIDES: Mapping[str, str] = {
    "calculate_per_token_loss": "with it megatron-core skips its 1/DP gradient average, which hpcrl's loss scaling (× micro-batches × DP) relies on, so gradients would come out DP times too large",
}


def rule_model_overrides_loss_scaling(recipe: Recipe) -> list[Problem]:
    if not megatron_enabled(recipe):
        return []
    overrides = recipe.policy.megatron_cfg.model_overrides
    return [
        Problem(
            path=f"{MEGATRON}.model_overrides.{key}",
            value=overrides[key],
            message=f"hpcrl's losses are already per-token shares of the global batch; {reason}",
            fix=f"remove {MEGATRON}.model_overrides.{key} (token-level loss: loss_fn.token_level_loss=true)",
        )
        for key, reason in LOSS_SCALING_OVERRIDES.items()
        if key in overrides and overrides[key] not in (False, None)
    ]


def first_class_target(key: str) -> str | None:
    if key in FIRST_CLASS_MODEL_OVERRIDES:
        return FIRST_CLASS_MODEL_OVERRIDES[key]
    if key in attrs.fields_dict(MegatronCfg):
        return f"{MEGATRON}.{key}"
    return None


MODEL_OVERRIDES_CHECKED_IN_JOB = """\
Contract for policy.megatron_cfg.model_overrides (the hook for the Megatron backend):

On the login node only keys duplicating first-class fields are rejected
(rule_model_overrides_first_class). Whether every other key is a real field of the model
provider can only be known where megatron-bridge is installed: the Megatron backend, which
owns the provider, merges the overrides into the freshly built provider before it is
finalized, and first calls
    hpcrl.config.megatron_rules.provider_field_problems(model_overrides, provider_field_names)
and raises hpcrl.config.errors.ConfigError(problems) if it returns any, so an unknown field
fails at setup with its full config path, the bad value and a did-you-mean.
"""


def provider_field_problems(
    model_overrides: Mapping[str, Any], provider_field_names: Any
) -> list[Problem]:
    """In-job check (see MODEL_OVERRIDES_CHECKED_IN_JOB): unknown provider fields."""
    known = sorted(provider_field_names)
    problems = []
    for key, value in model_overrides.items():
        if key in known:
            continue
        guess = did_you_mean(key, known)
        problems.append(
            Problem(
                path=f"{MEGATRON}.model_overrides.{key}",
                value=value,
                message="not a field of this model's Megatron provider",
                fix=(
                    f"did you mean {MEGATRON}.model_overrides.{guess}?"
                    if guess
                    else "remove it; check the provider class of this model in megatron-bridge"
                ),
            )
        )
    return problems


# --------------------------------------------------------------------------- distillation teacher
def rule_teacher_overrides(recipe: Recipe) -> list[Problem]:
    if recipe.teacher is None:
        return []
    overrides = recipe.teacher.megatron_cfg_overrides
    path = "teacher.megatron_cfg_overrides"
    problems = [
        Problem(
            path=f"{path}.{key}",
            value=overrides[key],
            message="manual GC is set once per worker process, by the policy; a teacher cannot change it",
            fix=f"remove {path}.{key} (set {MEGATRON}.{key} for the policy instead)",
        )
        for key in TEACHER_REJECTED_KEYS
        if key in overrides
    ]
    allowed = {key: value for key, value in overrides.items() if key not in TEACHER_REJECTED_KEYS}
    return problems + _teacher_structure_problems(recipe, allowed, path)


def _teacher_structure_problems(
    recipe: Recipe, overrides: dict[str, Any], path: str
) -> list[Problem]:
    merged = deep_merge(unstructure(recipe.policy.megatron_cfg), overrides)
    prefix = tuple(path.split("."))
    _, issues = try_structure(merged, MegatronCfg, prefix=prefix)
    # Problems of the policy's own megatron_cfg are reported under their own path.
    return [
        issue.problem
        for issue in issues
        if issue.parts[len(prefix) : len(prefix) + 1] and issue.parts[len(prefix)] in overrides
    ]


OVERRIDE_RULES = (
    rule_model_overrides_first_class,
    rule_model_overrides_loss_scaling,
    rule_teacher_overrides,
)
