"""Ranges of numbers a recipe field cannot bound by itself: the keyword arguments of the
Automodel optimizer and schedulers (a mapping, its keys named by the user), and ranges that
involve two fields. (NaN and infinity never get this far: the converter refuses them.)

A field's own range is declared beside it (``hpcrl.config.field_bounds``); each rule here
returns problems naming the full key path, the value and the fix. Rules of the RL math
(losses, sampling) live in ``hpcrl.config.rules``; Megatron's cross-field rules in
``hpcrl.config.megatron_rules``.
"""

from __future__ import annotations

import math
from typing import TypeGuard

from hpcrl.config.errors import Problem
from hpcrl.config.field_bounds import FieldBound, at_least
from hpcrl.config.recipe import Recipe


def _at_least(path: str, value: float | int | None, low: float, fix: str) -> list[Problem]:
    problem = at_least(low, fix).problem(path, value)
    return [] if problem is None else [problem]


def _fraction(path: str, value: float, fix: str, *, open_high: bool = True) -> list[Problem]:
    bound = FieldBound(low=0.0, high=1.0, high_open=open_high, fix=fix)
    problem = bound.problem(path, value)
    return [] if problem is None else [problem]


def _number(value: object) -> TypeGuard[int | float]:
    """A finite number (anything else in kwargs is reported by hpcrl.config.optimizers)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def rule_optimizer_ranges(recipe: Recipe) -> list[Problem]:
    """``policy.optimizer.kwargs`` and ``policy.scheduler`` kwargs (Automodel). Kinds and names are ``hpcrl.config.optimizers``' rules: a value of
    the wrong kind is reported there and skipped here. (``kwargs.lr`` > 0 is checked there too.)"""
    return _optimizer_kwarg_ranges(recipe) + _scheduler_kwarg_ranges(recipe)


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


def rule_consolidated_needs_checkpoints(recipe: Recipe) -> list[Problem]:
    cfg = recipe.checkpointing
    problems = []
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
    rule_response_fits_sequence,
    rule_optimizer_ranges,
    rule_consolidated_needs_checkpoints,
)
