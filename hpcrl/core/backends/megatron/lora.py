"""LoRA on the Megatron backend (``policy.megatron_cfg.peft``): megatron-bridge's own ``LoRA``,
applied as NeMo RL's Megatron worker applies it, to the model chunks before megatron DDP wraps
them (so DDP's gradient buffers and the optimizer hold the adapters alone).

megatron-bridge wraps each chosen linear in a ``LoRALinear``: the base linear stays under
``<linear>.to_wrap`` in the module tree, while its checkpoint keys keep the base names
(``...linear_qkv.weight``) and the adapters add ``...linear_qkv.adapter.linear_in.weight`` (A)
and ``...adapter.linear_out.weight`` (B), both tensor-parallel beside tensor-parallel linears.
Every other parameter is frozen. The base weights come from the conversion (never from a
training checkpoint, which holds the adapters alone); exports merge ``W + alpha/dim * B @ A``
(megatron-bridge's ``export_hf_weights`` with its default ``merge_adapter_weights``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from hpcrl.config.recipe import MegatronPeftCfg

PEFT_PATH = "policy.megatron_cfg.peft"
ADAPTER_KEY_PART = ".adapter."

V = TypeVar("V")


def build_lora(cfg: MegatronPeftCfg) -> Any:
    """megatron-bridge's ``LoRA`` with the recipe's settings (NeMo RL's keys, its names)."""
    from hpcrl.core.backends.megatron.bridge_compat import import_bridge_lora

    return import_bridge_lora()(
        target_modules=list(cfg.target_modules),
        exclude_modules=list(cfg.exclude_modules),
        dim=cfg.dim,
        alpha=cfg.alpha,
        dropout=cfg.dropout,
        dropout_position=cfg.dropout_position,
        lora_A_init_method=cfg.lora_A_init_method,
        lora_B_init_method=cfg.lora_B_init_method,
        a2a_experimental=cfg.a2a_experimental,
        lora_dtype=None,
    )


def lora_for(cfg: MegatronPeftCfg) -> Any:
    """megatron-bridge's ``LoRA`` for ``cfg``, or None when ``cfg`` is off."""
    return build_lora(cfg) if cfg.enabled else None


def lora_pre_wrap_hook(cfg: MegatronPeftCfg) -> Callable[[list], list]:
    """The hook megatron-bridge runs on the bare chunks before any wrap: adapters on, base
    frozen; fails with the config's path when no linear was chosen."""

    def apply(chunks: list) -> list:
        adapted = lora_for(cfg)(chunks, training=True)
        if not adapter_parameter_names(adapted):
            linears = sorted({name.rpartition(".")[2] for name in linear_names(adapted)})
            raise ValueError(
                f"{PEFT_PATH}: target_modules={list(cfg.target_modules)} / exclude_modules="
                f"{list(cfg.exclude_modules)} choose no linear layer of the model (its "
                f"linears are named {linears}); name some of them, or empty both lists to "
                "adapt every linear"
            )
        return adapted

    return apply


def linear_names(chunks: list) -> list[str]:
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    kinds = (ColumnParallelLinear, RowParallelLinear)
    return [name for chunk in chunks for name, m in chunk.named_modules() if isinstance(m, kinds)]


def adapter_parameter_names(chunks: list) -> list[str]:
    return [
        name
        for chunk in chunks
        for name, _ in chunk.named_parameters()
        if ADAPTER_KEY_PART in f".{name}"
    ]


def is_adapter_key(key: str) -> bool:
    return ADAPTER_KEY_PART in f".{key}"


def adapters_only(state: Mapping[str, V]) -> dict[str, V]:
    """The adapter entries of a (sharded) model state dict: what a LoRA checkpoint holds."""
    return {key: value for key, value in state.items() if is_adapter_key(key)}


def without_adapters(state: Mapping[str, V]) -> dict[str, V]:
    """The base entries: what the conversion (a model without adapters) holds."""
    return {key: value for key, value in state.items() if not is_adapter_key(key)}


def lora_summary(chunks: list) -> str:
    """One line for the job log: how many linears got adapters, and the share trained."""
    params = [p for chunk in chunks for p in chunk.parameters()]
    trained = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    adapted = len(adapter_parameter_names(chunks)) // 2
    return (
        f"[hpcrl lora] megatron-bridge LoRA adapters on {adapted} linear layers; {trained:,} "
        f"of {total:,} parameters on this rank trained ({100.0 * trained / max(total, 1):.2f}%)"
    )


def to_module_names(state: Mapping[str, V], chunk: Any) -> dict[str, V]:
    """``state`` (checkpoint names) with the names ``chunk.load_state_dict`` expects: an
    adapted linear's checkpoint keys are the base names (``X.weight``), its module holds the
    base under ``X.to_wrap``; without adapters ``state`` comes back as it is."""
    wrapped = {name for name, module in chunk.named_modules() if hasattr(module, "to_wrap")}
    if not wrapped:
        return dict(state)
    renamed = {}
    for key, value in state.items():
        parent, _, leaf = key.rpartition(".")
        renamed[f"{parent}.to_wrap.{leaf}" if parent in wrapped else key] = value
    return renamed
