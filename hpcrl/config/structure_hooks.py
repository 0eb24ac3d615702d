"""The container structuring hooks of hpcrl's one cattrs converter (``hpcrl.config.converter``,
which keeps the scalar hooks: a float of the recipe crosses one file, not two): Literal
choices with "did you mean", lists, one-or-many sections and mappings that collect every
item's error with its index or key.

Each hook raises ``BadValue`` (message, and a fix that may use ``{path}``); the converter
turns it into a ``Problem`` at the value's full key path.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from typing import Any, Literal

import attrs
import cattrs
from cattrs.errors import IterableValidationNote

from hpcrl.config.refusal_reasons import UNSUPPORTED_CHOICES
from hpcrl.config.suggestions import did_you_mean


class BadValue(ValueError):
    """A value of the wrong type or outside its choices; ``fix`` may use ``{path}``."""

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.message = message
        self.fix = fix


class KeyNote(str):
    """Marks an error inside a dict field with the dict key (cattrs' notes hold list indexes)."""

    key: str

    def __new__(cls, key: str) -> KeyNote:
        note = super().__new__(cls, f"@ key {key!r}")
        note.key = key
        return note


def register_container_hooks(strict: cattrs.Converter) -> None:
    """Register this module's hooks (Literal choices, lists, one-or-many sections, mappings)
    on ``strict``; the converter registers its scalar hooks itself."""
    strict.register_structure_hook_factory(_is_literal, _literal_hook)
    strict.register_structure_hook_factory(_is_one_or_many, lambda t: _one_or_many_hook(t, strict))
    strict.register_structure_hook_factory(_is_tuple, lambda t: _tuple_hook(t, strict))
    strict.register_structure_hook_factory(_is_dict, lambda t: _dict_hook(t, strict))


# --------------------------------------------------------------------------- Literal, tuple, dict
def _is_literal(type_: Any) -> bool:
    return typing.get_origin(type_) is Literal


def _literal_hook(type_: Any):
    choices = typing.get_args(type_)

    def structure(value: Any, _: type) -> Any:
        if value in choices and type(value) in {type(choice) for choice in choices}:
            return value
        listed = ", ".join(str(choice) for choice in choices)
        if isinstance(value, str) and value in UNSUPPORTED_CHOICES:
            raise BadValue(UNSUPPORTED_CHOICES[value], "set {path} to one of: " + listed)
        guess = did_you_mean(str(value), [str(choice) for choice in choices])
        fix = f"did you mean {guess}? " if guess else ""
        raise BadValue(
            f"{value!r} is not one of: {listed}", fix + "set {path} to one of: " + listed
        )

    return structure


def _is_tuple(type_: Any) -> bool:
    return typing.get_origin(type_) is tuple


def _tuple_hook(type_: Any, converter: cattrs.Converter):
    args = typing.get_args(type_)
    variadic = len(args) == 2 and args[1] is Ellipsis

    def structure(value: Any, _: type) -> tuple:
        if value is None and variadic:
            return ()  # NeMo RL writes null for "none" (stop_token_ids: null, ...)
        if variadic and isinstance(value, Mapping) and _single_mapping_ok(args[0]):
            value = [value]
        if not isinstance(value, list | tuple):
            raise BadValue(
                f"expected a list, got {type_name(value)}", "write a YAML list: {path}: [a, b]"
            )
        if not variadic and len(value) != len(args):
            raise BadValue(f"expected a list of {len(args)} items, got {len(value)}", "")
        item_types = [args[0]] * len(value) if variadic else list(args)
        items, errors = [], []
        for index, (item, item_type) in enumerate(zip(value, item_types, strict=True)):
            try:
                items.append(converter.structure(item, item_type))
            except Exception as exc:  # collected and reported with their index
                exc.add_note(IterableValidationNote(f"@ index {index}", index, item_type))
                errors.append(exc)
        if errors:
            raise cattrs.IterableValidationError("While structuring a list", errors, type_)
        return tuple(items)

    return structure


def _is_one_or_many(type_: Any) -> bool:
    """``C | tuple[C, ...] | None`` for an attrs class C: one section or a list of them
    (NeMo RL's ``data.train``: one data set, or several concatenated)."""
    members = [arg for arg in typing.get_args(type_) if arg is not type(None)]
    if len(members) != 2:
        return False
    single = next((m for m in members if isinstance(m, type) and attrs.has(m)), None)
    return single is not None and tuple[single, ...] in members  # type: ignore[valid-type]


def _one_or_many_hook(type_: Any, converter: cattrs.Converter):
    single = next(m for m in typing.get_args(type_) if isinstance(m, type) and attrs.has(m))
    many = _tuple_hook(tuple[single, ...], converter)  # type: ignore[valid-type]

    def structure(value: Any, _: type) -> Any:
        if value is None:
            return None
        if isinstance(value, list | tuple):
            return many(value, type_)
        return converter.structure(value, single)

    return structure


def _single_mapping_ok(item_type: Any) -> bool:
    """Lists whose items declare ``ACCEPTS_SINGLE_MAPPING`` (NeMo RL's ``policy.scheduler``)
    also take one mapping for a list of one."""
    return bool(getattr(item_type, "ACCEPTS_SINGLE_MAPPING", False))


def _is_dict(type_: Any) -> bool:
    return typing.get_origin(type_) is dict


def _dict_hook(type_: Any, converter: cattrs.Converter):
    _, value_type = typing.get_args(type_) or (str, Any)

    def structure(value: Any, _: type) -> dict:
        if value is None:
            return {}  # NeMo RL writes null for "none" (env_vars: null, ...)
        if not isinstance(value, Mapping):
            raise BadValue(
                f"expected a mapping (key: value), got {type_name(value)}",
                "write {path}: {KEY: VALUE}",
            )
        result, errors = {}, []
        for key, item in value.items():
            try:
                result[str(key)] = _dict_item(item, value_type, converter)
            except Exception as exc:
                exc.add_note(KeyNote(str(key)))
                errors.append(exc)
        if errors:
            raise cattrs.IterableValidationError("While structuring a mapping", errors, type_)
        return result

    return structure


def _dict_item(item: Any, value_type: Any, converter: cattrs.Converter) -> Any:
    if (
        value_type is str
        and isinstance(item, float)
        and (not math.isfinite(item) or "e" in repr(item))
    ):
        # .nan, .inf or 1e20 as text would not be what was typed ("nan", "1e+20")
        raise BadValue(f"expected a string, got the number {item!r}", 'quote it: "..."')
    if value_type is str and isinstance(item, int | float) and not isinstance(item, bool):
        return str(item)  # environment variables: `NCCL_DEBUG_LEVEL: 1` means "1"
    if value_type is str and isinstance(item, bool):
        raise BadValue("expected a string, got a boolean", 'quote it: "1"/"0" or "true"/"false"')
    return converter.structure(item, value_type)


# --------------------------------------------------------------------------- helpers
def type_name(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if type(value) in names:
        return (
            f"{names[type(value)]} ({value!r})"
            if not isinstance(value, str)
            else f"the string {value!r}"
        )
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__
