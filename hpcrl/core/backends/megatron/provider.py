"""The megatron-bridge model provider: recipe settings and ``model_overrides`` applied to it.

Order (same at conversion and at load, so the persisted run config is what trains):
  1. a fresh provider from the HF config (``AutoBridge.to_megatron_provider``);
  2. settings that need Transformer Engine switched off when it is absent (local spec, its
     core attention swapped for torch SDPA: ``attention.py``);
  3. first-class ``policy.megatron_cfg`` fields (parallel sizes, recompute, offload, ...);
  4. ``policy.megatron_cfg.model_overrides`` (user wins over everything above);
  5. ``finalize()`` — only then is a model instantiated from it.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcrl.config.megatron_rules import megatron_recompute

if TYPE_CHECKING:
    from hpcrl.config.recipe import MegatronCfg

OVERRIDES_PATH = "policy.megatron_cfg.model_overrides"

# Fused kernels that exist only with Transformer Engine / Apex; their torch fallbacks are
# the local spec. (megatron-core refuses e.g. apply_rope_fusion without TE >= 1.4.)
TE_ONLY_PROVIDER_FLAGS = (
    "apply_rope_fusion",
    "bias_activation_fusion",
    "gradient_accumulation_fusion",
    "masked_softmax_fusion",
    "persist_layer_norm",
    "bias_dropout_fusion",
    "cross_entropy_loss_fusion",
    "moe_permute_fusion",
    "moe_grouped_gemm",
)
#: MoE settings passed to the provider when the recipe sets them (NeMo RL's names).
MOE_PROVIDER_FIELDS = (
    "moe_router_dtype",
    "moe_router_load_balancing_type",
    "moe_router_bias_update_rate",
    "moe_token_dispatcher_type",
    "moe_permute_fusion",
    "moe_shared_expert_overlap",
    "moe_per_layer_logging",
    "moe_grouped_gemm",
    "moe_router_enable_expert_bias",
    "moe_enable_deepep",
    "moe_flex_dispatcher_backend",
)

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def transformer_engine_available() -> bool:
    from hpcrl.core.backends.megatron.bridge_compat import transformer_engine_installed

    return transformer_engine_installed()


class ModelOverrideError(ValueError):
    """A ``model_overrides`` key the provider does not have (a user mistake)."""


def use_local_spec(provider: Any) -> list[str]:
    """Build with megatron-core's local (pure torch) layer spec; returns the flags turned off."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    # the spec holds the q/k norm modules itself: without them a Qwen3 (qk_layernorm) model
    # would be built, and its norms' weights silently dropped, with no error
    provider.transformer_layer_spec = get_gpt_layer_local_spec(
        qk_layernorm=bool(getattr(provider, "qk_layernorm", False))
    )
    turned_off = []
    for flag in TE_ONLY_PROVIDER_FLAGS:
        if getattr(provider, flag, False):
            setattr(provider, flag, False)
            turned_off.append(flag)
    return turned_off


def apply_attention_backend(provider: Any, name: str) -> None:
    """megatron-core's ``AttnBackend[name]`` on the provider, as NeMo RL sets it; the NVTE_*
    kernel switches are dropped from the environment, as NeMo RL drops them, so that
    Transformer Engine follows the named backend rather than a stale variable."""
    import os

    from megatron.core.transformer.enums import AttnBackend

    for variable in ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"):
        os.environ.pop(variable, None)
    provider.attention_backend = AttnBackend[name]


def apply_megatron_cfg(provider: Any, cfg: MegatronCfg, precision: str, seq_length: int) -> None:
    """Copy the first-class recipe fields onto the provider (before overrides)."""
    import torch

    for name in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "sequence_parallel",
        "cpu_offloading",
        "cpu_offloading_num_layers",
        "fine_grained_activation_offloading",
        "cuda_graph_impl",
    ):
        setattr(provider, name, getattr(cfg, name))
    for name, value in megatron_recompute(cfg).items():
        setattr(provider, name, value)
    if cfg.recompute_modules:
        provider.recompute_modules = list(cfg.recompute_modules)
    if cfg.offload_modules:
        provider.offload_modules = list(cfg.offload_modules)
    if cfg.apply_rope_fusion:
        provider.apply_rope_fusion = True
    if cfg.bias_activation_fusion:
        provider.bias_activation_fusion = True
    if cfg.freeze_moe_router:
        provider.moe_router_freeze = True
    if cfg.attention_backend is not None:
        apply_attention_backend(provider, cfg.attention_backend)
    has_te = transformer_engine_available()
    for name in MOE_PROVIDER_FIELDS:
        value = getattr(cfg, name)
        if value is None or value is False or (name in TE_ONLY_PROVIDER_FLAGS and not has_te):
            continue
        setattr(provider, name, value)
    if cfg.moe_hybridep_num_sms is not None:
        # megatron-core's newer name for it where it has one, as NeMo RL sets it
        field = (
            "moe_flex_dispatcher_num_sms"
            if hasattr(provider, "moe_flex_dispatcher_num_sms")
            else "moe_hybridep_num_sms"
        )
        setattr(provider, field, cfg.moe_hybridep_num_sms)
    params_dtype = getattr(torch, _DTYPES[precision])
    provider.params_dtype = params_dtype
    provider.bf16 = precision == "bfloat16"
    provider.fp16 = precision == "float16"
    provider.pipeline_dtype = (
        getattr(torch, cfg.pipeline_dtype) if cfg.pipeline_dtype else params_dtype
    )
    provider.seq_length = seq_length


def apply_model_overrides(
    target: Any, overrides: Mapping[str, Any], path: str = OVERRIDES_PATH
) -> None:
    """Set each override on ``target``; a nested dict recurses into the nested config object.

    Unknown fields raise ``ModelOverrideError`` naming ``path.<key>`` and the closest fields.
    """
    for key, value in overrides.items():
        key_path = f"{path}.{key}"
        known = _field_names(target)
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ModelOverrideError(
                f"{key_path}: {type(target).__name__} has no field {key!r}{hint} "
                f"Remove it or use one of the provider's fields."
            )
        current = getattr(target, key, None)
        if isinstance(value, Mapping) and current is not None and not isinstance(current, Mapping):
            apply_model_overrides(current, value, key_path)
        else:
            setattr(target, key, value)


def _field_names(target: Any) -> set[str]:
    if dataclasses.is_dataclass(target):
        return {field.name for field in dataclasses.fields(target)}
    return {name for name in vars(target) if not name.startswith("_")}


def prepare_provider(provider: Any, cfg: MegatronCfg, precision: str, seq_length: int) -> list[str]:
    """Steps 2–4 of the module docstring; returns the TE-only flags that were turned off."""
    # The recipe's fields go first so that the TE-only fusions it asks for (NeMo RL's configs
    # set apply_rope_fusion: true) are switched off, and reported, when TE is absent;
    # megatron-core would refuse them in finalize(). Explicit model_overrides still win.
    apply_megatron_cfg(provider, cfg, precision, seq_length)
    turned_off = []
    if not transformer_engine_available():
        from hpcrl.core.backends.megatron.attention import apply_sdpa_core_attention

        turned_off = use_local_spec(provider)
        # Automatic, no recipe knob: same numbers as the unfused local attention (tested),
        # without its S×S score tensor. A user-set transformer_layer_spec override wins.
        apply_sdpa_core_attention(provider)
    apply_model_overrides(provider, cfg.model_overrides)
    return turned_off
