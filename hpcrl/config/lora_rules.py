"""Load-time rules of ``policy.automodel_cfg.lora_cfg`` (NeMo RL's ``dtensor_cfg.lora_cfg``):
which linears get adapters must be said one way only, and LoRA with tensor parallelism. The
adapters' rank and dropout are bounded beside their fields (``hpcrl.config.recipe_lora``).
What the model's own module names match is checked when the job builds the model
(``hpcrl.core.backends.automodel.lora.apply_lora``). ``policy.megatron_cfg.peft``: what
megatron-bridge's LoRA asserts on, and the keys hpcrl does not honour (``rule_megatron_peft``)."""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import MegatronPeftCfg, Recipe

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


PEFT = "policy.megatron_cfg.peft"


def rule_megatron_peft(recipe: Recipe) -> list[Problem]:
    """``policy.megatron_cfg.peft``: what megatron-bridge's LoRA would assert on, and the two
    keys hpcrl does not honour (refused whenever the Megatron backend is on, as off-only
    keys are), by name before the queue wait."""
    if recipe.backend != "megatron":
        return []
    cfg = recipe.policy.megatron_cfg.peft
    problems = _megatron_peft_off_only(cfg)
    if not cfg.enabled:
        return problems
    if cfg.target_modules and cfg.exclude_modules:
        problems.append(
            Problem(
                path=f"{PEFT}.exclude_modules",
                value=list(cfg.exclude_modules),
                message="megatron-bridge's LoRA takes target_modules or exclude_modules, not "
                f"both (target_modules={list(cfg.target_modules)})",
                fix=f"empty {PEFT}.exclude_modules or {PEFT}.target_modules",
            )
        )
    if cfg.dim < 1:
        problems.append(
            Problem(path=f"{PEFT}.dim", value=cfg.dim, message="the LoRA rank must be at "
                    "least 1", fix=f"set {PEFT}.dim to a positive rank (8, 16, 32, ...)")
        )  # fmt: skip
    if not 0.0 <= cfg.dropout < 1.0:
        problems.append(
            Problem(path=f"{PEFT}.dropout", value=cfg.dropout, message="dropout is a "
                    "probability below 1", fix=f"set {PEFT}.dropout between 0.0 (off) and 1.0")
        )  # fmt: skip
    return problems


def _megatron_peft_off_only(cfg: MegatronPeftCfg) -> list[Problem]:
    problems = []
    if cfg.a2a_experimental:
        problems.append(
            Problem(
                path=f"{PEFT}.a2a_experimental",
                value=True,
                message="the all-to-all exchange of expert adapters (MoE with expert "
                "parallelism) is not supported by hpcrl yet",
                fix=f"set {PEFT}.a2a_experimental=false",
            )
        )
    if cfg.lora_dtype not in (None, "None"):
        problems.append(
            Problem(
                path=f"{PEFT}.lora_dtype",
                value=cfg.lora_dtype,
                message="adapters in a dtype of their own are not supported by hpcrl yet: they "
                "take the model's parameter dtype",
                fix=f"set {PEFT}.lora_dtype=null",
            )
        )
    return problems


LORA_RULES = (rule_lora_targets, rule_lora_tensor_parallel, rule_megatron_peft)
