"""Optimizer, LR schedule and DTensor-aware gradient clipping of the Automodel backend."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hpcrl.config.recipe import OptimizerCfg, Recipe, SchedulerCfg


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimizerCfg, *, fused: bool = False
) -> torch.optim.Optimizer:
    """Call right after ``fully_shard`` so the optimizer holds the sharded parameters.
    ``fused``: one kernel per step for Adam(W) (GPU only)."""
    params = [p for p in params if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    optimizer_cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    return optimizer_cls(
        params,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )


def lr_factor(
    step: int, *, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """Multiplier of the base LR for optimizer step ``step`` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if name == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if name == "linear":
        shape = 1.0 - progress
    else:  # cosine
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def total_steps_of(recipe: Recipe, cfg: SchedulerCfg) -> int:
    if cfg.total_steps is not None:
        return cfg.total_steps
    algorithm_cfg = recipe.grpo if recipe.grpo is not None else recipe.sft
    return algorithm_cfg.max_num_steps if algorithm_cfg is not None else 1


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, recipe: Recipe
) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per optimizer step."""
    cfg = recipe.policy.scheduler
    factor = functools.partial(
        lr_factor,
        name=cfg.name,
        warmup_steps=cfg.warmup_steps,
        total_steps=total_steps_of(recipe, cfg),
        min_lr_ratio=cfg.min_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _grads_by_mesh(params: Iterable[torch.nn.Parameter]) -> dict[object, list[torch.nn.Parameter]]:
    """Parameters with gradients, grouped by the mesh of their (D)Tensor gradient: DTensor
    ops (norms, foreach scaling) cannot mix tensors of different meshes (FSDP vs FSDP×TP)."""
    from torch.distributed.tensor import DTensor

    by_mesh: dict[object, list[torch.nn.Parameter]] = {}
    for param in params:
        if param.grad is not None:
            key = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
            by_mesh.setdefault(key, []).append(param)
    return by_mesh


def grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """Global L2 norm of all gradients, whatever mesh each (D)Tensor lives on."""
    from torch.distributed.tensor import DTensor

    total_sq = torch.zeros((), dtype=torch.float32)
    for group in _grads_by_mesh(params).values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq = total_sq + norm.float().cpu() ** 2
    return total_sq.sqrt()


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float | None) -> float:
    """Scale gradients so their global norm is at most ``max_norm``; returns the norm before."""
    norm = grad_norm(params)
    if max_norm is not None and max_norm > 0 and math.isfinite(float(norm)):
        # One foreach kernel per mesh, device and dtype instead of a (DTensor-dispatched)
        # mul_ per parameter: the per-parameter loop was a visible CPU cost on one H200.
        for group in _grads_by_mesh(params).values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
    return float(norm)
