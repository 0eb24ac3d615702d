"""Load-time rules of ``policy.automodel_cfg.lora_cfg`` (NeMo RL's ``dtensor_cfg.lora_cfg``):
which linears get adapters must be said one way only, and LoRA with tensor parallelism. The
adapters' rank and dropout are bounded beside their fields (``hpcrl.config.recipe_lora``).
What the model's own module names match is checked when the job builds the model
(``hpcrl.core.backends.automodel.lora.apply_lora``)."""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

LORA = "policy.automodel_cfg.lora_cfg"


def rule_lora_targets(recipe: Recipe) -> list[Problem]:
    """NeMo Automodel refuses targets and excludes together, and either beside
    match_all_linear (which would silently win); with none of the three nothing is adapted."""
    cfg = recipe.policy.automodel_cfg.lora_cfg
    if not (recipe.policy.automodel_cfg.enabled and cfg.enabled):
        return []
    if cfg.match_all_linear and (cfg.target_modules or cfg.exclude_modules):
        named = "target_modules" if cfg.target_modules else "exclude_modules"
        return [
            Problem(
                path=f"{LORA}.match_all_linear",
                value=True,
                message=f"match_all_linear adapts every linear layer, so {LORA}.{named} "
                "would be ignored",
                fix=f"set {LORA}.match_all_linear=false to use {named}, or empty {named}",
            )
        ]
    if cfg.target_modules and cfg.exclude_modules:
        return [
            Problem(
                path=f"{LORA}.exclude_modules",
                value=list(cfg.exclude_modules),
                message="target_modules and exclude_modules exclude each other (NeMo "
                "Automodel's rule): name the layers to adapt, or the ones to leave out",
                fix=f"empty {LORA}.exclude_modules or {LORA}.target_modules",
            )
        ]
    if not (cfg.match_all_linear or cfg.target_modules or cfg.exclude_modules):
        return [
            Problem(
                path=f"{LORA}.target_modules",
                value=[],
                message="no layer is chosen for LoRA: match_all_linear is false and "
                "target_modules and exclude_modules are empty",
                fix=f"set {LORA}.match_all_linear=true, or list {LORA}.target_modules (e.g. "
                "['*_proj'])",
            )
        ]
    return []


def rule_lora_tensor_parallel(recipe: Recipe) -> list[Problem]:
    """hpcrl's TP plan shards the plain linears of each block (q/k/v/o, gate/up/down): it
    has no sharding for adapters, so the two are refused together before the queue wait."""
    automodel = recipe.policy.automodel_cfg
    if (
        not (automodel.enabled and automodel.lora_cfg.enabled)
        or automodel.tensor_parallel_size == 1
    ):
        return []
    return [
        Problem(
            path=f"{LORA}.enabled",
            value=True,
            message="LoRA with tensor parallelism is not supported by hpcrl's Automodel backend "
            f"yet (policy.automodel_cfg.tensor_parallel_size={automodel.tensor_parallel_size}): "
            "its tensor-parallel plan has no sharding for the adapters",
            fix="set policy.automodel_cfg.tensor_parallel_size=1 (FSDP shards the frozen "
            f"weights and the adapters over every GPU), or {LORA}.enabled=false",
        )
    ]


LORA_RULES = (rule_lora_targets, rule_lora_tensor_parallel)
