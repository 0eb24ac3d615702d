"""A merged config that needs nothing OmegaConf does, resolved without importing it.

``hpcrl.config.merged_yaml.load_merged`` builds a ``DictConfig`` to apply overrides and
resolve ``${...}``: with neither to do, the build and ``to_container`` give back the data as
it was, at ~40 ms of importing omegaconf and its parser (most of a plain ``hpcrl validate``'s
start-up). ``is_plain`` says when that is so: keys all strings, values only what YAML gives
(mappings, lists, strings, numbers, booleans, null), no string OmegaConf reads as an
interpolation (``${``) or as a missing value (``???``). A value OmegaConf would store
otherwise (a path, bytes, an enum, a non-string key) or a string that is too large
(``hpcrl.config.interpolation_size``) takes OmegaConf's path, with its checks and messages.
``tests/config/test_plain_config.py`` compares the two paths.
"""

from __future__ import annotations

import copy
from typing import Any

from hpcrl.config.interpolation_size import oversized_values

MISSING_VALUE = "???"  # OmegaConf's "must be set"
_SCALAR_TYPES = (str, int, float, bool, type(None))  # bool is an int; listed to be plain


def is_plain(data: dict[str, Any]) -> bool:
    """Whether OmegaConf's build, resolution and ``to_container`` give ``data`` back as is."""
    return _plain_value(data) and not oversized_values(data)


def _plain_value(value: Any) -> bool:
    kind = type(value)
    if kind is dict:
        return all(type(key) is str and _plain_value(item) for key, item in value.items())
    if kind is list:
        return all(_plain_value(item) for item in value)
    if kind is str:
        return "${" not in value and value != MISSING_VALUE
    return kind in _SCALAR_TYPES


def plain_copies(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(resolved, raw)``: independent copies, as OmegaConf's path returns them."""
    return copy.deepcopy(data), copy.deepcopy(data)
