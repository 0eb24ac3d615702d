"""Optimizer, LR schedule and DTensor-aware gradient clipping of the Automodel backend."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hpcrl.config.recipe import LrSchedulerCfg, OptimizerCfg
    from hpcrl.core.backends.automodel.master_weights import ComputeCopies


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimizerCfg, *, fused: bool = False
) -> torch.optim.Optimizer:
    """The torch class ``cfg.name`` with ``cfg.kwargs`` (NeMo RL's form; the config rules
    checked both against ``hpcrl.config.optimizers``). Call right after ``fully_shard`` so
    the optimizer holds the sharded parameters. ``fused``: one kernel per step (GPU only),
    used unless the recipe sets ``fused`` or ``foreach`` itself."""
    from hpcrl.config.optimizers import OPTIMIZER_KWARGS, TE_FUSED_ADAM, class_name

    assert cfg.name in OPTIMIZER_KWARGS, f"the config rules admit no optimizer {cfg.name!r}"
    params = [p for p in params if p.requires_grad]
    kwargs = dict(cfg.kwargs)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    if cfg.name == TE_FUSED_ADAM:
        return te_fused_adam()(params, **_with_dtypes(kwargs))
    if fused and "fused" not in kwargs and "foreach" not in kwargs:
        kwargs["fused"] = True
    return getattr(torch.optim, class_name(cfg.name))(params, **kwargs)


def te_fused_adam() -> type[torch.optim.Optimizer]:
    """Transformer Engine's FusedAdam from the job's Python, or an error naming the key."""
    try:
        from transformer_engine.pytorch.optimizers.fused_adam import FusedAdam
    except ImportError as error:
        raise ValueError(
            "policy.optimizer.name: transformer_engine.pytorch.optimizers.fused_adam.FusedAdam "
            f"needs Transformer Engine in the job's Python ({error}); NeMo RL's images carry "
            "it, or set policy.optimizer.name=torch.optim.AdamW"
        ) from None
    return FusedAdam


def _with_dtypes(kwargs: dict) -> dict:
    """NeMo RL's "torch.bfloat16" strings (the config rules admit a few) as torch dtypes."""
    from hpcrl.config.optimizers import DTYPE_NAMES

    return {
        key: getattr(torch, value.removeprefix("torch.")) if value in DTYPE_NAMES else value
        for key, value in kwargs.items()
    }


def build_training_optimizer(
    params: Iterable[torch.nn.Parameter],
    cfg: OptimizerCfg,
    *,
    copies: ComputeCopies | None = None,
    on_gpu: bool,
    cpu_offload: bool,
    offload_fraction: float,
    host_threads: int | None = None,
) -> torch.optim.Optimizer:
    """The Automodel worker's optimizer: ``build_optimizer`` (fused on the GPU unless FSDP's
    CPU offload steps it on the host), or with ``offload_fraction`` > 0
    (``policy.automodel_cfg.optimizer_offload_fraction``) the same Adam/AdamW with that share
    of its state in host memory (``host_offload.HostOffloadAdam``; the config rules admit
    the fraction only with Adam or AdamW and without ``cpu_offload``). ``copies``: the model's
    linear weights compute through bf16 copies (``master_weights``), which
    ``master_adam.MasterWeightAdam`` steps with them."""
    if copies is not None:
        return _master_weight_adam(params, cfg, copies)
    if offload_fraction <= 0:
        return build_optimizer(params, cfg, fused=on_gpu and not cpu_offload)
    from hpcrl.config.optimizers import class_name
    from hpcrl.core.backends.automodel.host_offload import HostOffloadAdam

    assert class_name(cfg.name) in ("Adam", "AdamW") and not cpu_offload, cfg.name
    kwargs = dict(cfg.kwargs)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    if on_gpu and "fused" not in kwargs and "foreach" not in kwargs:
        kwargs["fused"] = True  # the device-side part, as without offload
    return HostOffloadAdam(
        [p for p in params if p.requires_grad],
        offload_fraction=offload_fraction,
        host_threads=host_threads,
        decoupled_weight_decay=class_name(cfg.name) == "AdamW",
        **kwargs,
    )


def _master_weight_adam(
    params: Iterable[torch.nn.Parameter], cfg: OptimizerCfg, copies: ComputeCopies
) -> torch.optim.Optimizer:
    from hpcrl.config.optimizers import class_name
    from hpcrl.core.backends.automodel.master_adam import MasterWeightAdam

    name = class_name(cfg.name)
    assert name in ("Adam", "AdamW"), "takes_master_weights admits Adam and AdamW only"
    kwargs = {k: v for k, v in cfg.kwargs.items() if k not in ("fused", "foreach")}
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    if name == "AdamW":
        kwargs.setdefault("weight_decay", 1e-2)  # torch.optim.AdamW's default
    return MasterWeightAdam(
        [p for p in params if p.requires_grad],
        copies,
        decoupled_weight_decay=name == "AdamW",
        **kwargs,
    )


def clip_before_step(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_norm: float | None
) -> torch.Tensor:
    """``clip_gradients``, or the clip an optimizer applies inside its step (one that has
    ``clip_before_step``: ``master_adam.MasterWeightAdam``); the norm as a device tensor."""
    clip_in_step = getattr(optimizer, "clip_before_step", None)
    if clip_in_step is not None:
        return clip_in_step(max_norm)
    return clip_gradients(params, max_norm)


def host_threads_per_worker(local_world_size: int) -> int:
    """torch threads for a GPU worker's host-side optimizer step: this node's cores shared by
    its workers (Ray starts a one-CPU actor with one thread)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, local_world_size))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Every device-side state tensor of ``optimizer`` to ``device`` (around generation);
    state an offloading optimizer keeps on the host stays there."""
    from hpcrl.core.backends.automodel.host_offload import HostOffloadAdam

    if isinstance(optimizer, HostOffloadAdam):
        optimizer.move_device_state(device)
        return
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, entries: Sequence[LrSchedulerCfg] | None
) -> torch.optim.lr_scheduler.LRScheduler:
    """NeMo RL's ``policy.scheduler``: nothing → constant LR; one entry → that scheduler;
    several → ``SequentialLR`` over them with the ``milestones`` entry. Stepped once per
    optimizer step."""
    from hpcrl.config.optimizers import class_name

    named = [entry for entry in entries or () if entry.name is not None]
    if not named:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, _constant_factor)
    schedulers = [
        getattr(torch.optim.lr_scheduler, class_name(entry.name))(optimizer, **entry.kwargs)
        for entry in named
        if entry.name is not None
    ]
    if len(schedulers) == 1:
        return schedulers[0]
    milestones = next(e.milestones for e in entries or () if e.milestones is not None)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, list(milestones))


def _constant_factor(step: int) -> float:
    del step
    return 1.0


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
    """Global L2 norm of all gradients, whatever mesh each (D)Tensor lives on, as a 0-dim
    fp32 tensor on the gradients' device: reading it is the caller's host wait. The experts
    of expert parallelism (tagged with their EP group) differ per EP rank: their squared
    norm is summed over the group (every rank of it calls the all-reduce: each keeps
    experts)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from hpcrl.core.backends.automodel.expert_parallel import EXPERT_GROUP_ATTR

    params = list(params)
    device = next((_local_grad(p).device for p in params if p.grad is not None), None)
    total_sq = torch.zeros((), dtype=torch.float32, device=device or "cpu")
    expert_groups: dict[object, torch.Tensor] = {}
    for param in params:
        group = getattr(param, EXPERT_GROUP_ATTR, None)
        if group is not None:
            expert_groups.setdefault(group, torch.zeros_like(total_sq))
    for (_, group), members in _grads_by_mesh_and_group(params).items():
        norm = torch.nn.utils.get_total_norm([p.grad for p in members], norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squared = norm.float().to(total_sq.device) ** 2
        if group is None:
            total_sq = total_sq + squared
        else:
            expert_groups[group] = expert_groups[group] + squared
    for group, expert_sq in expert_groups.items():
        member = next(p for p in params if getattr(p, EXPERT_GROUP_ATTR, None) is group)
        summed = expert_sq.to(member.device)
        dist.all_reduce(summed, group=group)
        total_sq = total_sq + summed.to(total_sq.device)
    return total_sq.sqrt()


def _local_grad(param: torch.nn.Parameter) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    grad = param.grad
    assert grad is not None
    return grad.to_local() if isinstance(grad, DTensor) else grad


def _grads_by_mesh_and_group(
    params: Iterable[torch.nn.Parameter],
) -> dict[tuple[object, object], list[torch.nn.Parameter]]:
    from hpcrl.core.backends.automodel.expert_parallel import EXPERT_GROUP_ATTR

    by_key: dict[tuple[object, object], list[torch.nn.Parameter]] = {}
    for mesh, members in _grads_by_mesh(params).items():
        for param in members:
            group = getattr(param, EXPERT_GROUP_ATTR, None)
            by_key.setdefault((mesh, group), []).append(param)
    return by_key


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Scale gradients so their global norm is at most ``max_norm``; returns the norm before
    (a device tensor: the caller reads it with the step's other figures). A non-finite norm
    leaves the gradients as they are. Decided on the device: the host queues the optimizer
    step without waiting for the backward to finish (docs/performance.md, item 1)."""
    norm = grad_norm(params)
    if max_norm is not None and max_norm > 0:
        # A zero norm makes clip_grads_with_norm_'s factor 1.0: unscaled, as for a finite
        # norm under max_norm.
        finite_norm = torch.where(torch.isfinite(norm), norm, torch.zeros_like(norm))
        # One foreach kernel per mesh, device and dtype instead of a (DTensor-dispatched)
        # mul_ per parameter: the per-parameter loop was a visible CPU cost of a step that
        # was CPU-bound (docs/performance.md, "Figures behind the code").
        for group in _grads_by_mesh(params).values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, finite_norm, foreach=True)
    return norm
