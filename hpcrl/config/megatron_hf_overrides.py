"""Which ``policy.hf_config_overrides`` the Megatron backend applies, checked at validate.

The backend builds megatron-bridge's provider (and its conversion, refit and export) from the
HF config with the overrides applied (``hpcrl.core.backends.megatron.hf_overrides``). A key
is admitted only where it is known to reach the Megatron model with Hugging Face's meaning:

- ``max_position_embeddings``: the bridge maps it to the provider's ``seq_length``, which
  hpcrl sets from ``policy.max_total_sequence_length`` as for any model; it matters to
  the model, as in HF, as YaRN's ``original_max_position_embeddings`` when that is unset;
- ``rope_scaling: null`` (plain RoPE) or of ``rope_type: yarn``: megatron-core's YaRN RoPE, its fields completed
  by hpcrl where megatron-bridge 0.3 leaves them unset or unused (tested for parity
  with the HF model in tests/megatron/test_hf_config_overrides.py).

Everything else is refused by key with the reason: megatron-bridge copies a fixed set of HF
fields into the provider, so any other change (or another RoPE scaling, which it drops)
would train a model other than the one the sampler runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcrl.config.errors import Problem

PATH = "policy.hf_config_overrides"
ADMITTED_KEYS = ("max_position_embeddings", "rope_scaling")
#: rope_scaling keys of YaRN that Hugging Face reads and megatron-core has a field for
YARN_KEYS = (
    "rope_type",
    "type",
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "rope_theta",
)
AUTOMODEL_FIX = "or train with the Automodel backend (policy.automodel_cfg.enabled=true), which applies any change"


def megatron_hf_override_problems(overrides: Mapping[str, Any]) -> list[Problem]:
    """Problems of ``policy.hf_config_overrides`` for the Megatron backend (full key paths)."""
    problems = []
    for key, value in sorted(overrides.items()):
        if key == "rope_scaling":
            problems += _rope_scaling_problems(value)
        elif key not in ADMITTED_KEYS:
            problems.append(
                Problem(
                    path=f"{PATH}.{key}",
                    value=value,
                    message="hpcrl's Megatron backend applies only "
                    f"{' and '.join(ADMITTED_KEYS)} (YaRN) from the Hugging Face config: "
                    "megatron-bridge copies a fixed set of HF fields into its model provider, "
                    f"and a change to {key!r} has not been shown to reach the Megatron model",
                    fix=f"remove {PATH}.{key}, set it in a copy of the model's config.json, "
                    + AUTOMODEL_FIX,
                )
            )
    return problems


def _rope_scaling_problems(value: Any) -> list[Problem]:
    path = f"{PATH}.rope_scaling"
    if value is None:  # no scaling: the bridge then builds plain RoPE, as HF computes it
        return []
    if not isinstance(value, Mapping):
        return [
            Problem(
                path=path,
                value=value,
                message="must be a mapping (Hugging Face's rope_scaling dict)",
                fix=f"write {path} as a mapping such as {{rope_type: yarn, factor: 4.0}}",
            )
        ]
    kind = value.get("rope_type", value.get("type"))
    if kind != "yarn":
        return [
            Problem(
                path=f"{path}.rope_type",
                value=kind,
                message="megatron-bridge carries only YaRN rope scaling into megatron-core's "
                "model; another scaling would be dropped and the Megatron model would use "
                "plain RoPE while the sampler uses the scaled one",
                fix=f"set {path}.rope_type=yarn, remove {path}, " + AUTOMODEL_FIX,
            )
        ]
    problems = []
    if "factor" not in value:
        problems.append(
            Problem(
                path=f"{path}.factor",
                value=None,
                message="YaRN needs its scaling factor (Hugging Face fails without it)",
                fix=f"set {path}.factor, e.g. 4.0",
            )
        )
    for key in sorted(set(value) - set(YARN_KEYS)):
        reason = (
            "megatron-core's YaRN derives the attention factor from factor, mscale and "
            "mscale_all_dim; it has no field for an explicit one"
            if key == "attention_factor"
            else f"not a YaRN setting megatron-core reads ({', '.join(YARN_KEYS)})"
        )
        problems.append(
            Problem(
                path=f"{path}.{key}",
                value=value[key],
                message=reason,
                fix=f"remove {path}.{key}, " + AUTOMODEL_FIX,
            )
        )
    return problems
