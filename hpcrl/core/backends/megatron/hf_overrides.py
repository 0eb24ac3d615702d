"""``policy.hf_config_overrides`` on the Megatron backend.

megatron-bridge is handed the model's HF config with the overrides applied, by the same code
and with the same meaning as the Automodel backend (``hpcrl.core.models.hf_config``): the
provider, the conversion's run config and the HF folder an export writes (its config.json)
all come from that config. Which keys reach here is decided on the login side
(``hpcrl.config.megatron_hf_overrides``): ``max_position_embeddings`` and a YaRN
``rope_scaling``.

megatron-bridge 0.3 maps a YaRN ``rope_scaling`` into the provider's ``yarn_*`` fields but
leaves gaps against Hugging Face's reading of the same dict; ``complete_yarn`` closes them so
that the Megatron model computes what the HF model (sampler, vLLM, Automodel) computes:

- the Qwen2, Qwen3 and Llama bridges set ``position_embedding_type = "rope"`` after the
  generic mapping, so the yarn fields would go unused: plain RoPE, no error;
- keys HF defaults when absent (``beta_fast`` 32, ``beta_slow`` 1, ``truncate`` true,
  ``original_max_position_embeddings`` = the config's ``max_position_embeddings``) arrive
  as None or megatron-core's own default;
- the attention factor: HF divides ``get_mscale(factor, mscale)`` by
  ``get_mscale(factor, mscale_all_dim)`` only when both are non-zero and otherwise uses
  ``get_mscale(factor)``; megatron-core divides whenever both are set. The pair is set so
  that megatron-core's factor is HF's;
- ``rope_scaling.rope_theta``: transformers 4 takes the base from the config's
  ``rope_theta`` and ignores this key, and so does the bridge; a value that differs from
  the config's is refused rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcrl.core.models.hf_config import OVERRIDES_PATH, load_hf_config

YARN_PATH = f"{OVERRIDES_PATH}.rope_scaling"


def bridge_with_overrides(model_path: str, overrides: Mapping[str, Any]) -> Any:
    """megatron-bridge's ``AutoBridge`` for ``model_path`` reading the overridden config."""
    from hpcrl.core.backends.megatron.bridge_compat import import_bridge

    bridge = import_bridge().AutoBridge.from_hf_pretrained(model_path)
    if overrides:
        config = load_hf_config(model_path, overrides)
        check_rope_theta(config)
        # the bridge's HF side reads its config lazily through this property: the provider,
        # the HF model loaded for conversion and save_hf_pretrained's config.json all use it
        bridge.hf_pretrained.config = config
    return bridge


def check_rope_theta(config: Any) -> None:
    scaling = getattr(config, "rope_scaling", None) or {}
    theta = scaling.get("rope_theta")
    if theta is not None and float(theta) != float(config.rope_theta):
        raise ValueError(
            f"{YARN_PATH}.rope_theta = {theta}: the model's rope_theta is {config.rope_theta}, "
            "and Hugging Face (transformers 4) and megatron-bridge take the RoPE base from that "
            f"field, not from rope_scaling, so {theta} would be ignored; fix: set it to "
            f"{config.rope_theta} or remove it, or set {OVERRIDES_PATH}.rope_theta"
        )


def is_yarn(config: Any) -> bool:
    scaling = getattr(config, "rope_scaling", None)
    if not isinstance(scaling, Mapping):
        return False
    return (scaling.get("rope_type") or scaling.get("type")) == "yarn"


def complete_yarn(provider: Any, config: Any) -> None:
    """The provider's YaRN settings as Hugging Face reads ``config.rope_scaling`` (module
    docstring); nothing for other RoPE or for MLA providers (their own fields)."""
    if not is_yarn(config) or getattr(provider, "multi_latent_attention", False):
        return
    scaling = config.rope_scaling
    provider.position_embedding_type = "yarn"
    provider.yarn_rotary_scaling_factor = float(scaling["factor"])
    provider.yarn_original_max_position_embeddings = int(
        scaling.get("original_max_position_embeddings") or config.max_position_embeddings
    )
    # HF: ``or`` defaults, so 0 counts as unset there too
    provider.yarn_beta_fast = float(scaling.get("beta_fast") or 32)
    provider.yarn_beta_slow = float(scaling.get("beta_slow") or 1)
    provider.yarn_correction_range_round_to_int = bool(scaling.get("truncate", True))
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        provider.yarn_mscale, provider.yarn_mscale_all_dim = float(mscale), float(mscale_all_dim)
    else:
        # megatron-core's ratio with (1, 0) is get_mscale(factor) / 1: HF's fallback
        provider.yarn_mscale, provider.yarn_mscale_all_dim = 1.0, 0.0
