"""Every key path a schema has, for "did you mean" over leaf names.

``policy.lr=1e-5`` names no key: the learning rate is ``policy.optimizer.kwargs.lr`` (Automodel)
or ``policy.megatron_cfg.optimizer.lr`` (Megatron). A sibling-name guess cannot find those;
``keys_ending_like`` finds the schema's paths below the same prefix whose last parts are the
ones typed (or close to them). Free-form mappings whose keys hpcrl still knows (the torch
optimizer's arguments under ``policy.optimizer.kwargs``) count as keys too.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterator
from typing import Any

import attrs

from hpcrl.config.suggestions import did_you_mean

#: How many suggestions a problem names at most.
MAX_SUGGESTIONS = 3
#: Sections named after the default (Automodel) backend's keys: a user who typed
#: ``policy.lr`` most often means the Automodel optimizer's.
LATER_SECTIONS = frozenset({"megatron_cfg", "value", "teacher"})


def _without_none(field_type: Any) -> Any:
    args = typing.get_args(field_type)
    if args and type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        return rest[0] if len(rest) == 1 else field_type
    return field_type


def _paths(
    cls: type, prefix: tuple[str, ...], seen: frozenset[type], mapping_keys: dict[Any, list[str]]
) -> Iterator[tuple[str, ...]]:
    for name, field_type in typing.get_type_hints(cls).items():
        path = (*prefix, name)
        inner = _without_none(field_type)
        if attrs.has(inner) and inner not in seen:
            yield from _paths(inner, path, seen | {inner}, mapping_keys)
        elif (cls, name) in mapping_keys:
            yield from ((*path, key) for key in mapping_keys[(cls, name)])
        else:
            yield path


def _known_mapping_keys() -> dict[Any, list[str]]:
    """(class, field) of a free-form mapping -> the keys hpcrl knows in it."""
    from hpcrl.config.optimizers import OPTIMIZER_KWARGS
    from hpcrl.config.recipe import OptimizerCfg

    arguments = sorted({name for kwargs in OPTIMIZER_KWARGS.values() for name in kwargs})
    return {(OptimizerCfg, "kwargs"): arguments}


@functools.cache
def schema_paths(schema: type) -> tuple[tuple[str, ...], ...]:
    """Every leaf key path of the attrs ``schema`` (nested classes walked, each once per
    branch), with the known keys of its free-form mappings as leaves below them."""
    return tuple(_paths(schema, (), frozenset({schema}), _known_mapping_keys()))


def keys_ending_like(schema: type, parts: tuple[str, ...], depth: int) -> list[str]:
    """Paths of ``schema`` below ``parts[:depth]`` that end with ``parts[depth:]`` (the part
    that does not exist and what follows it), shortest first; when none ends exactly so, those
    whose last part is close to the typed one."""
    prefix, tail = parts[:depth], parts[depth:]
    below = [path for path in schema_paths(schema) if path[:depth] == prefix]
    exact = [path for path in below if len(path) > len(parts) and path[-len(tail) :] == tail]
    if not exact:
        last_names = {path[-1] for path in below}
        close = did_you_mean(tail[-1], last_names)
        exact = [path for path in below if close is not None and path[-1] == close]
        exact = [path for path in exact if len(path) >= len(parts)]
    exact.sort(key=lambda path: (len(path), bool(LATER_SECTIONS & set(path)), path))
    return [".".join(path) for path in exact[:MAX_SUGGESTIONS]]
