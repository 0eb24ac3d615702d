"""Ranges of plain numbers in a recipe: optimizer settings, schedules, checkpointing, the
allocation. (NaN and infinity never get this far: the converter refuses them.)

Each rule returns problems naming the full key path, the value and the fix. Rules of the RL
math (losses, sampling) live in ``hpcrl.config.rules``; Megatron's cross-field rules in
``hpcrl.config.megatron_rules``.
"""

from __future__ import annotations

import math
from typing import TypeGuard

from hpcrl.config.errors import Problem
from hpcrl.config.field_bounds import RECIPE_BOUNDS, check_bounds
from hpcrl.config.recipe import Recipe

#: Far above any cluster (the largest have ~10,000 nodes): a count beyond it is a typo.
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
MAX_WORKER_SLOTS_PER_NODE = 1024
#: Slurm CPUs (hardware threads) and memory of one node: the largest single machines have
#: ~1,800 threads and 32-48 TB; beyond these a value is a typo.
MAX_CPUS_PER_NODE = 4096
MAX_MEM_GB_PER_NODE = 65_536
#: Prompts or samples of one training step: far above any GRPO or SFT batch (NeMo RL's
#: largest recipes take a few thousand); beyond it a value is a typo.
MAX_BATCH = 1_000_000


def _at_least(path: str, value: float | int | None, low: float, fix: str) -> list[Problem]:
    if value is None or value >= low:
        return []
    must = "at least " + (f"{low:g}" if isinstance(low, float) else str(low))
    return [Problem(path=path, value=value, message=f"must be {must}", fix=fix)]


def _fraction(path: str, value: float, fix: str, *, open_high: bool = True) -> list[Problem]:
    high_ok = value < 1.0 if open_high else value <= 1.0
    if 0.0 <= value and high_ok:
        return []
    interval = "[0, 1)" if open_high else "[0, 1]"
    return [Problem(path=path, value=value, message=f"must be in {interval}", fix=fix)]


def _number(value: object) -> TypeGuard[int | float]:
    """A finite number (anything else in kwargs is reported by hpcrl.config.optimizers)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def rule_optimizer_ranges(recipe: Recipe) -> list[Problem]:
    """``policy.optimizer.kwargs`` and ``policy.scheduler`` kwargs (Automodel) and
    ``policy.max_grad_norm``. Kinds and names are ``hpcrl.config.optimizers``' rules: a value of
    the wrong kind is reported there and skipped here. (``kwargs.lr`` > 0 is checked there too.)"""
    problems = _optimizer_kwarg_ranges(recipe) + _scheduler_kwarg_ranges(recipe)
    norm = recipe.policy.max_grad_norm
    if norm is not None and norm <= 0.0:
        problems.append(
            Problem(
                path="policy.max_grad_norm",
                value=norm,
                message="must be positive (gradients are clipped to this norm)",
                fix="set policy.max_grad_norm=1.0, or null to turn clipping off",
            )
        )
    return problems


def _optimizer_kwarg_ranges(recipe: Recipe) -> list[Problem]:
    opt = recipe.policy.optimizer
    if opt is None:
        return []
    kwargs, path = opt.kwargs, "policy.optimizer.kwargs"
    problems = []
    for name, fix in (("weight_decay", "e.g. 0.0 or 0.01"), ("momentum", "e.g. 0.0 or 0.9")):
        if _number(kwargs.get(name)):
            problems += _at_least(f"{path}.{name}", kwargs[name], 0.0, fix)
    eps = kwargs.get("eps")
    if _number(eps) and eps <= 0.0:
        problems.append(
            Problem(path=f"{path}.eps", value=eps, message="must be positive", fix="e.g. 1.0e-8")
        )
    betas = kwargs.get("betas")
    if isinstance(betas, list | tuple) and all(_number(beta) for beta in betas):
        for index, beta in enumerate(betas):
            problems += _fraction(f"{path}.betas[{index}]", beta, "e.g. betas: [0.9, 0.999]")
    return problems


# scheduler kwarg -> (lowest allowed value, fix); factors are checked as fractions below.
_SCHEDULER_LOWS = {
    "total_iters": (0, "0 or more optimizer steps"),
    "T_max": (1, "the optimizer steps of one cosine half-period, e.g. 1000"),
    "step_size": (1, "optimizer steps between decays, e.g. 100"),
    "eta_min": (0.0, "the lowest learning rate, e.g. 0.0"),
    "gamma": (0.0, "the decay factor, e.g. 0.1"),
}


def _scheduler_kwarg_ranges(recipe: Recipe) -> list[Problem]:
    problems = []
    for index, entry in enumerate(recipe.policy.scheduler or ()):
        path = f"policy.scheduler[{index}].kwargs"
        for name, value in entry.kwargs.items():
            if not _number(value):
                continue
            if name in _SCHEDULER_LOWS:
                low, fix = _SCHEDULER_LOWS[name]
                problems += _at_least(f"{path}.{name}", value, low, fix)
            elif name == "start_factor" and value == 0:  # torch's LinearLR refuses 0
                problems.append(
                    Problem(path=f"{path}.{name}", value=value, message="must be above 0",
                            fix="a factor in (0, 1], e.g. 0.1")
                )  # fmt: skip
            elif name in ("start_factor", "end_factor", "factor"):
                problems += _fraction(
                    f"{path}.{name}", value, "a factor of the learning rate in [0, 1]",
                    open_high=False,
                )  # fmt: skip
    return problems


def rule_megatron_optimizer_ranges(recipe: Recipe) -> list[Problem]:
    """``policy.megatron_cfg.optimizer`` and ``.scheduler`` numbers (any backend: a later
    switch to Megatron must not inherit a bad value silently)."""
    opt = recipe.policy.megatron_cfg.optimizer
    path = "policy.megatron_cfg.optimizer"
    problems = []
    for name in ("lr", "min_lr", "weight_decay", "clip_grad", "sgd_momentum"):
        problems += _at_least(f"{path}.{name}", getattr(opt, name), 0.0, "a number >= 0")
    for name in ("adam_beta1", "adam_beta2"):
        problems += _fraction(f"{path}.{name}", getattr(opt, name), "e.g. 0.9 and 0.999")
    if opt.adam_eps <= 0.0:
        problems.append(
            Problem(path=f"{path}.adam_eps", value=opt.adam_eps, message="must be positive",
                    fix="e.g. 1.0e-8")
        )  # fmt: skip
    if opt.min_lr > opt.lr >= 0.0:
        problems.append(
            Problem(path=f"{path}.min_lr", value=opt.min_lr, message=f"above {path}.lr ({opt.lr})",
                    fix=f"set {path}.min_lr <= {path}.lr")
        )  # fmt: skip
    sched = recipe.policy.megatron_cfg.scheduler
    spath = "policy.megatron_cfg.scheduler"
    problems += _at_least(f"{spath}.lr_warmup_iters", sched.lr_warmup_iters, 0, "0 for none")
    problems += _at_least(f"{spath}.lr_decay_iters", sched.lr_decay_iters, 1, "or null")
    problems += _at_least(f"{spath}.lr_warmup_init", sched.lr_warmup_init, 0.0, "e.g. 0.0")
    return problems


def rule_checkpointing_ranges(recipe: Recipe) -> list[Problem]:
    cfg = recipe.checkpointing
    problems = _at_least(
        "checkpointing.save_period", cfg.save_period, 1,
        "save every N >= 1 steps (checkpointing.enabled=false to save none)",
    )  # fmt: skip
    problems += _at_least(
        "checkpointing.keep_top_k", cfg.keep_top_k, 1, "keep at least one, or null to keep all"
    )
    if cfg.save_consolidated and not cfg.enabled:
        problems.append(
            Problem(
                path="checkpointing.save_consolidated",
                value=True,
                message="writes a Hugging Face folder beside each saved checkpoint, but "
                "checkpointing.enabled is false: nothing is saved",
                fix="set checkpointing.enabled=true (and checkpointing.save_period=N), or "
                "export after the run with hpcrl export RUN",
            )
        )
    return problems


def rule_schedule_ranges(recipe: Recipe) -> list[Problem]:
    """Epochs, data loader workers, input length."""
    problems = []
    for name, section in (("grpo", recipe.grpo), ("sft", recipe.sft)):
        if section is None:
            continue
        problems += _at_least(f"{name}.max_num_epochs", section.max_num_epochs, 1, "e.g. 1")
        # val_period: any integer; NeMo RL validates only when it is > 0 (-1 and 0 mean off)
    problems += _at_least("data.num_workers", recipe.data.num_workers, 0, "0: load in the driver")
    problems += _at_least(
        "data.max_input_seq_length", recipe.data.max_input_seq_length, 1, "or null: no limit"
    )
    return problems


def rule_allocation_bounds(recipe: Recipe) -> list[Problem]:
    """Node and per-node counts no cluster has (``cluster.num_nodes=1e20``)."""
    resources = recipe.policy.generation.colocated.resources
    counts = (
        ("cluster.num_nodes", recipe.cluster.num_nodes, MAX_NODES),
        ("cluster.gpus_per_node", recipe.cluster.gpus_per_node, MAX_WORKER_SLOTS_PER_NODE),
        ("policy.generation.colocated.resources.num_nodes", resources.num_nodes, MAX_NODES),
        ("policy.generation.colocated.resources.gpus_per_node", resources.gpus_per_node,
         MAX_WORKER_SLOTS_PER_NODE),
    )  # fmt: skip
    return [
        Problem(
            path=path,
            value=value,
            message=f"more than any cluster has (at most {limit:,})",
            fix=f"set {path} to the allocation the recipe is written for",
        )
        for path, value, limit in counts
        if value is not None and value > limit
    ]


def rule_batch_bounds(recipe: Recipe) -> list[Problem]:
    """Batch counts no training step takes (``grpo.num_prompts_per_step=1e20``)."""
    counts = {
        "policy.train_global_batch_size": recipe.policy.train_global_batch_size,
        "policy.train_micro_batch_size": recipe.policy.train_micro_batch_size,
    }
    if recipe.grpo is not None:
        counts["grpo.num_prompts_per_step"] = recipe.grpo.num_prompts_per_step
        counts["grpo.num_generations_per_prompt"] = recipe.grpo.num_generations_per_prompt
    return [
        Problem(
            path=path,
            value=value,
            message=f"more than any training step takes (at most {MAX_BATCH:,})",
            fix=f"set {path} to what one step trains on, e.g. 32",
        )
        for path, value in counts.items()
        if value > MAX_BATCH
    ]


def rule_field_bounds(recipe: Recipe) -> list[Problem]:
    """Each field's own range (``hpcrl.config.field_bounds``: seeds, step counts, ...)."""
    return check_bounds(recipe, RECIPE_BOUNDS)


def rule_response_fits_sequence(recipe: Recipe) -> list[Problem]:
    """GRPO's ``max_new_tokens`` cannot exceed the context a prompt and its response share
    (vLLM's ``max_model_len`` where set, else ``max_total_sequence_length``): each response
    is capped at what its prompt leaves, as in NeMo RL, so ``max_new_tokens`` equal to the
    context (NeMo RL's ``${policy.max_total_sequence_length}``) means "as long as fits"."""
    generation = recipe.policy.generation
    context = recipe.policy.max_total_sequence_length
    if generation.backend == "vllm" and generation.vllm_cfg.max_model_len is not None:
        context = generation.vllm_cfg.max_model_len
    if recipe.grpo is None or context < 1 or generation.max_new_tokens <= context:
        return []
    return [
        Problem(
            path="policy.generation.max_new_tokens",
            value=generation.max_new_tokens,
            message=f"longer than any response can be: a prompt and its response share "
            f"{context:,} tokens (the generation context), and each response stops at what "
            "its prompt leaves",
            fix=f"set policy.generation.max_new_tokens to at most {context:,} (or "
            "${policy.max_total_sequence_length}: as long as fits), or raise "
            "policy.max_total_sequence_length",
        )
    ]


RANGE_RULES = (
    rule_field_bounds,
    rule_response_fits_sequence,
    rule_optimizer_ranges,
    rule_megatron_optimizer_ranges,
    rule_checkpointing_ranges,
    rule_schedule_ranges,
    rule_allocation_bounds,
    rule_batch_bounds,
)
