"""Offload and CUDA-graph settings that megatron-core implements only with Transformer Engine
or CUDA: checked once per node by the job's preflight (``hpcrl.core.machine_checks``), before
Ray starts and anything is built.

The settings themselves pass straight through (``provider.apply_megatron_cfg`` → the
TransformerConfig fields, ``model.optimizer_config`` → the OptimizerConfig fields,
``env_vars`` exported first). What this module adds is a clear, early failure where they
cannot work, instead of an AttributeError deep inside megatron-core.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from hpcrl.config.errors import Problem

if TYPE_CHECKING:
    from hpcrl.config.recipe import MegatronCfg

PREFIX = "policy.megatron_cfg"


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def requirement_problems(
    cfg: MegatronCfg, te_available: bool, cuda_available: bool
) -> list[Problem]:
    """Every setting that cannot run here, each with its key, what it needs and the fix."""
    problems = []
    te_settings: list[tuple[str, object]] = []
    if cfg.fine_grained_activation_offloading:
        te_settings.append(("fine_grained_activation_offloading", True))
    if cfg.cuda_graph_impl == "transformer_engine":
        te_settings.append(("cuda_graph_impl", "transformer_engine"))
    if cfg.sequence_parallel:
        te_settings.append(("sequence_parallel", True))
    if cfg.attention_backend in ("flash", "fused", "unfused"):
        te_settings.append(("attention_backend", cfg.attention_backend))
    if not te_available:
        problems += [
            Problem(
                path=f"{PREFIX}.{key}",
                value=value,
                message="requires Transformer Engine (transformer_engine is not importable in "
                "this environment)",
                fix="use a container with Transformer Engine or turn it off",
            )  # fmt: skip
            for key, value in te_settings
        ]
    if not cuda_available:
        if cfg.optimizer.optimizer_cpu_offload:
            problems.append(
                Problem(
                    path=f"{PREFIX}.optimizer.optimizer_cpu_offload",
                    value=True,
                    message="requires CUDA (megatron-core's HybridDeviceOptimizer splits "
                    "optimizer state between GPU and host)",
                    fix="turn it off: on CPU the optimizer already lives on the host",
                )  # fmt: skip
            )
        if cfg.cuda_graph_impl != "none":
            problems.append(
                Problem(
                    path=f"{PREFIX}.cuda_graph_impl",
                    value=cfg.cuda_graph_impl,
                    message="requires CUDA (CUDA graphs are captured on GPUs)",
                    fix=f"set {PREFIX}.cuda_graph_impl=none",
                )  # fmt: skip
            )
    return problems


def precision_aware_optimizer_on(cfg: MegatronCfg, te_available: bool) -> bool:
    """Whether megatron-core gets use_precision_aware_optimizer=true.

    megatron-core implements it with TE's FusedAdam, or with its HybridDeviceOptimizer when
    optimizer_cpu_offload is on. Without either it refuses to build. hpcrl keeps master
    weights and Adam moments in fp32 in both modes, so switching it off there changes where
    the fp32 master copy lives, not the math; the worker says so when it does.
    """
    requested = cfg.optimizer.use_precision_aware_optimizer
    return requested and (te_available or cfg.optimizer.optimizer_cpu_offload)
