"""Command-line overrides ``a.b.c=value``: parsed like YAML, checked against the schema.

A key that the schema does not have is an error with "did you mean" (a typo in an override
would otherwise silently do nothing); inside free-form mappings (``env_vars``,
``model_overrides``, ``megatron_cfg_overrides``, ``env.kwargs``, a profile's ``env``) new keys
are allowed.
"""

from __future__ import annotations

import os
import re
import typing
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.config.converter import did_you_mean
from hpcrl.config.errors import Problem

if TYPE_CHECKING:
    from omegaconf import DictConfig

DOTTED_KEY = re.compile(r"[A-Za-z0-9_][\w-]*(\.[A-Za-z0-9_][\w-]*)*")
ALIASES = {("policy", "dtensor_cfg"): ("policy", "automodel_cfg")}


@attrs.frozen
class Override:
    """One parsed override: dotted key parts and the YAML-typed value."""

    text: str
    parts: tuple[str, ...]
    value: Any


def parse_override(text: str) -> tuple[Override | None, list[Problem]]:
    """Parse ``key=value`` (a leading ``+``/``++`` as Hydra writes it is accepted)."""
    key, sep, raw_value = text.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key:
        return None, [_bad_syntax(text, "an override must look like KEY=VALUE")]
    if not DOTTED_KEY.fullmatch(key):
        return None, [_bad_syntax(text, f"{key!r} is not a dotted key (names joined by '.')")]
    from omegaconf import OmegaConf  # here: importing it is most of a cold `hpcrl render`

    try:
        # OmegaConf types the value as YAML would; a fixed key keeps its own key syntax out.
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw_value}"]), resolve=False)[
            "v"
        ]
    except Exception as exc:  # yaml and OmegaConf errors alike: report, don't crash
        return None, [_bad_syntax(text, " ".join(f"cannot parse the value: {exc}".split())[:200])]
    return Override(text=text, parts=tuple(key.split(".")), value=value), []


def apply_overrides(
    cfg: DictConfig, texts: typing.Sequence[str], schema: type
) -> tuple[DictConfig, list[Problem]]:
    """Apply overrides in order (later wins) to a merged config; problems for bad ones."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    problems: list[Problem] = []
    for text in texts:
        override, parse_problems = parse_override(text)
        problems += parse_problems
        if override is None:
            continue
        override, alias_problems = _apply_aliases(override)
        problems += alias_problems
        schema_problem = check_key_in_schema(override.parts, schema, text)
        if schema_problem is not None:
            problems.append(schema_problem)
            continue
        value = _absolute_data_path(override)
        try:
            OmegaConf.update(cfg, ".".join(override.parts), value, merge=True, force_add=True)
        except OmegaConfBaseException as exc:
            problems.append(_bad_syntax(text, f"cannot apply it: {exc}".splitlines()[0]))
    return cfg, problems


def check_key_in_schema(parts: tuple[str, ...], schema: type, text: str) -> Problem | None:
    """None if ``parts`` names a field of ``schema`` (or lies inside a free-form mapping)."""
    field_type: Any = schema
    for depth, part in enumerate(parts):
        field_type = _without_none(field_type)
        if field_type is Any or typing.get_origin(field_type) is dict:
            return None
        if not attrs.has(field_type):
            path = ".".join(parts[:depth])
            return Problem(
                path=".".join(parts),
                value=text,
                message=f"override goes below {path}, which holds a value, not keys",
                fix=f"set {path}=VALUE instead",
            )
        hints = _field_types(field_type)
        if part not in hints:
            return _unknown_override_key(parts, depth, list(hints), text)
        field_type = hints[part]
    return None


def _unknown_override_key(
    parts: tuple[str, ...], depth: int, known: list[str], text: str
) -> Problem:
    guess = did_you_mean(parts[depth], known)
    parent = ".".join(parts[:depth]) or "the top level"
    if guess:
        fix = "did you mean " + ".".join((*parts[:depth], guess, *parts[depth + 1 :])) + "?"
    else:
        fix = f"keys allowed under {parent}: {', '.join(known)}"
    return Problem(
        path=".".join(parts),
        value=text,
        message=f"override names a key that does not exist ({parts[depth]!r} under {parent})",
        fix=fix,
    )


def _apply_aliases(override: Override) -> tuple[Override, list[Problem]]:
    for old, new in ALIASES.items():
        if override.parts[: len(old)] == old:
            parts = new + override.parts[len(old) :]
            warning = alias_warning(".".join(override.parts), ".".join(parts))
            return attrs.evolve(override, parts=parts), [warning]
    return override, []


def alias_warning(old_path: str, new_path: str) -> Problem:
    return Problem(
        path=old_path,
        message=f"{old_path.split('.')[1]} is NeMo RL's older name; read as {new_path}",
        fix=f"rename it to {new_path}",
        severity="warning",
    )


def _absolute_data_path(override: Override) -> Any:
    # An override is typed in a shell: relative paths mean the current folder.
    is_data_path = override.parts in {("data", "train_path"), ("data", "val_path")}
    if is_data_path and isinstance(override.value, str) and "${" not in override.value:
        return os.path.abspath(os.path.expanduser(override.value))
    return override.value


def _bad_syntax(text: str, message: str) -> Problem:
    return Problem(
        path="<override>",
        value=text,
        message=message,
        fix="write overrides as dotted.key=value, e.g. policy.megatron_cfg.manual_gc=true",
    )


def _without_none(field_type: Any) -> Any:
    args = typing.get_args(field_type)
    if args and type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        return rest[0] if len(rest) == 1 else field_type
    return field_type


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
