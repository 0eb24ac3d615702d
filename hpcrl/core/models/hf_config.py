"""``policy.hf_config_overrides``: NeMo RL's changes to a model's Hugging Face config, applied
wherever hpcrl builds the model from it (the Automodel backend's ``from_pretrained``, the
torch sampler; vLLM gets the same mapping as its ``hf_overrides``).

A nested mapping changes the sub-config it names (``text_config: {router_aux_loss_coef:
0.0}`` changes that one field of ``config.text_config``, the others kept). A key the config
does not have is an error naming it: Hugging Face would keep it as an attribute nothing
reads, and the user's change would silently do nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OVERRIDES_PATH = "policy.hf_config_overrides"


def apply_hf_config_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """``config`` (a ``PretrainedConfig``) changed in place by ``overrides``; returned."""
    _apply(config, overrides, OVERRIDES_PATH)
    return config


def _apply(config: Any, overrides: Mapping[str, Any], path: str) -> None:
    from transformers import PretrainedConfig

    for key, value in overrides.items():
        here = f"{path}.{key}"
        if not hasattr(config, key):
            raise ValueError(
                f"{here}: the model's config ({type(config).__name__}) has no field {key!r}, "
                "so the value would be ignored; fix: remove it, or name a field of the "
                "model's config.json"
            )
        current = getattr(config, key)
        if isinstance(current, PretrainedConfig) and isinstance(value, Mapping):
            _apply(current, value, here)
        else:
            setattr(config, key, value)


def load_hf_config(model_path: str, overrides: Mapping[str, Any]) -> Any:
    """The model's config with ``overrides`` applied."""
    from transformers import AutoConfig

    return apply_hf_config_overrides(AutoConfig.from_pretrained(model_path), overrides)
