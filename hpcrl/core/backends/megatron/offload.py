"""Whether Transformer Engine is importable here, and what that decides for the optimizer.

Which settings need Transformer Engine or CUDA the planner decides, once
(``hpcrl.plan.machine_needs`` → ``JobSpec.machine_needs``); the job's preflight
(``hpcrl.core.machine_checks``) holds each node to it before Ray starts and anything is built.

The settings themselves pass straight through (``provider.apply_megatron_cfg`` → the
TransformerConfig fields, ``model.optimizer_config`` → the OptimizerConfig fields,
``env_vars`` exported first).
"""

from __future__ import annotations

import importlib.util


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def precision_aware_optimizer_on(
    requested: bool, optimizer_cpu_offload: bool, te_available: bool
) -> bool:
    """Whether megatron-core gets use_precision_aware_optimizer=true, for
    ``policy.megatron_cfg.optimizer``'s use_precision_aware_optimizer (``requested``) and
    optimizer_cpu_offload.

    megatron-core implements it with TE's FusedAdam, or with its HybridDeviceOptimizer when
    optimizer_cpu_offload is on. Without either it refuses to build. hpcrl keeps master
    weights and Adam moments in fp32 in both modes, so switching it off there changes where
    the fp32 master copy lives, not the math; the worker says so when it does.
    """
    return requested and (te_available or optimizer_cpu_offload)
