"""Merging one config mapping over another, as ``defaults:`` bases and NeMo RL's
``_override_`` sections merge: used by file loading and by the rule that checks
``megatron_cfg.model_overrides`` against the section they override."""

from __future__ import annotations

from typing import Any

REPLACE_MARKER = "_override_"  # NeMo RL's: this section replaces the bases' one


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` over ``base``: mappings merge key by key, anything else (lists too) replaces;
    a mapping holding ``_override_: true`` replaces the base's mapping whole."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and value.get(REPLACE_MARKER) is True:
            merged[key] = _without_markers(value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = _without_markers(value)
    return merged


def _without_markers(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _without_markers(item)
            for key, item in value.items()
            if not (key == REPLACE_MARKER and isinstance(item, bool))
        }
    return value
