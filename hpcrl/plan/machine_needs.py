"""What a planned job needs of the machine it lands on, decided once, at plan time: the
Megatron settings megatron-core implements only with Transformer Engine or only on GPUs, and
Automodel's CPU offload, which needs GPU workers.

One table, a row per setting (its key, what it needs, for which values), read against the
recipe into ``JobSpec.machine_needs``. The job's preflight (``hpcrl.core.machine_checks``)
then holds the node to that list alone: it never sees the recipe's sections, and nothing
decides again per rank. Where a need cannot be met the job fails in seconds with the key, its
value and the fix, instead of an AttributeError deep inside megatron-core.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Literal

import attrs

from hpcrl.config.moe_dispatch import FlexDispatch
from hpcrl.config.recipe import Recipe
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.run.jobspec import MachineNeed

MEGATRON = "policy.megatron_cfg"
_TE_MESSAGE = (
    "requires Transformer Engine (transformer_engine is not importable in this environment)"
)
_TE_FIX = "use a container with Transformer Engine or turn it off"


@attrs.frozen
class _Row(SharedMethods):
    backend: Literal["megatron", "automodel"]
    needs: Literal["transformer_engine", "cuda", "deep_ep", "hybrid_ep"]
    path: str
    when: Callable[[Any], bool]  # the values that need it
    message: str
    fix: str


def _on(value: Any) -> bool:
    return value is True


def _needs_te(path: str, when: Callable[[Any], bool] = _on) -> _Row:
    return _Row("megatron", "transformer_engine", f"{MEGATRON}.{path}", when, _TE_MESSAGE, _TE_FIX)


#: In the order the preflight reports them: Transformer Engine first, then CUDA.
_TABLE: tuple[_Row, ...] = (
    _needs_te("fine_grained_activation_offloading"),
    _needs_te("cuda_graph_impl", lambda impl: impl == "transformer_engine"),
    _needs_te("sequence_parallel"),
    _needs_te("attention_backend", lambda backend: backend in ("flash", "fused", "unfused")),
    _Row(
        "megatron", "cuda", f"{MEGATRON}.optimizer.optimizer_cpu_offload", _on,
        "requires CUDA (megatron-core's HybridDeviceOptimizer splits optimizer state between "
        "GPU and host)",
        "turn it off: on CPU the optimizer already lives on the host",
    ),
    _Row(
        "megatron", "cuda", f"{MEGATRON}.cuda_graph_impl", lambda impl: impl != "none",
        "requires CUDA (CUDA graphs are captured on GPUs)",
        f"set {MEGATRON}.cuda_graph_impl=none",
    ),
    _Row(
        "automodel", "cuda", "policy.automodel_cfg.cpu_offload", _on,
        "needs GPU workers (it keeps parameters in host memory between GPU steps)",
        "set it to false on CPU profiles",
    ),
)  # fmt: skip


def machine_needs(recipe: Recipe) -> tuple[MachineNeed, ...]:
    """The settings of ``recipe``'s backend that need Transformer Engine or CUDA, with their
    planned values: each row's key is read by its path, so only the settings in the table
    are looked at."""
    needs = []
    for row in _TABLE:
        if row.backend != recipe.backend:
            continue
        value = operator.attrgetter(row.path)(recipe)
        if row.when(value):
            needs.append(
                MachineNeed(
                    needs=row.needs, path=row.path, value=value, message=row.message, fix=row.fix
                )  # fmt: skip
            )
    return tuple(needs) + _flex_dispatch_needs(recipe)


def _flex_dispatch_needs(recipe: Recipe) -> tuple[MachineNeed, ...]:
    """megatron-core's flex dispatcher runs DeepEP's kernels: CUDA and the ``deep_ep`` package
    (its HybridEP buffer for hybridep; ``hpcrl.config.moe_dispatch``)."""
    flex = FlexDispatch.of(recipe)
    backend = flex.backend
    if recipe.backend != "megatron" or backend is None:
        return ()
    path, value = flex.key
    kernel = "HybridEP" if backend == "hybridep" else "DeepEP"
    return (
        MachineNeed(
            needs="hybrid_ep" if backend == "hybridep" else "deep_ep", path=path, value=value,
            message=f"requires DeepEP's {kernel} kernels (deep_ep."
            f"{'HybridEPBuffer' if backend == 'hybridep' else 'Buffer'} is not importable in "
            "this environment; NeMo RL's containers ship deep_ep)",
            fix="use a container with DeepEP (deep_ep, its hybrid-ep build for hybridep), or "
            f"set {MEGATRON}.moe_token_dispatcher_type=alltoall (the same tokens and results)",
        ),
        MachineNeed(
            needs="cuda", path=path, value=value,
            message=f"requires CUDA (DeepEP's {kernel} kernels run on GPUs)",
            fix=f"set {MEGATRON}.moe_token_dispatcher_type=alltoall on CPU profiles",
        ),
    )  # fmt: skip
