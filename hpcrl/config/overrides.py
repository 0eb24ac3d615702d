"""Command-line overrides, with Hydra's meanings (NeMo RL's users type them so):

- ``a.b=value`` sets a key (YAML-typed; ``a.b=null`` sets null). Unlike Hydra, the key need
  not be in the file: recipes are sparse and hpcrl's schema knows every key.
- ``+a.b=value`` adds a key the config does not hold yet (an error if it does);
- ``++a.b=value`` sets a key whether or not the config holds it;
- ``~a.b`` deletes a key (back to its default, or away for a section); ``~a.b=value`` deletes
  it only if it holds that value. Deleting needs the key to be in the config.

A key that the schema does not have is an error with "did you mean" (a typo in an override
would otherwise silently do nothing); inside free-form mappings (``env_vars``,
``model_overrides``, ``megatron_cfg_overrides``, ``env.kwargs``, a profile's ``env``) new keys
are allowed, and so are NeMo RL keys that hpcrl accepts or rejects by name
(``hpcrl.config.foreign_keys``).
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import attrs

from hpcrl.config.aliases import alias_warning, rename_path, spellings_of
from hpcrl.config.errors import Problem
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.config.suggestions import did_you_mean
from hpcrl.config.yaml_text import dict_container

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: Whether key parts outside the schema are still known to the loader (may be None).
KnownKey = Callable[[tuple[str, ...]], bool] | None

DOTTED_KEY = re.compile(r"[A-Za-z0-9_][\w-]*(\.[A-Za-z0-9_][\w-]*)*")
Action = Literal["set", "add", "force", "delete"]
_PREFIXES: tuple[tuple[str, Action], ...] = (("++", "force"), ("+", "add"), ("~", "delete"))
_NO_VALUE = object()  # ``~key`` without ``=value``


@attrs.frozen
class Override(SharedMethods):
    """One parsed override: what to do, dotted key parts and the YAML-typed value."""

    text: str
    parts: tuple[str, ...]
    value: Any
    action: Action = "set"


def parse_override(text: str) -> tuple[Override | None, list[Problem]]:
    """Parse ``key=value``, ``+key=value``, ``++key=value``, ``~key`` or ``~key=value``."""
    key, sep, raw_value = text.partition("=")
    key = key.strip()
    action: Action = "set"
    for prefix, prefix_action in _PREFIXES:
        if key.startswith(prefix):
            key, action = key[len(prefix) :], prefix_action
            break
    if not key or (not sep and action != "delete"):
        return None, [_bad_syntax(text, "an override must look like KEY=VALUE (or ~KEY)")]
    if not DOTTED_KEY.fullmatch(key):
        return None, [_bad_syntax(text, f"{key!r} is not a dotted key (names joined by '.')")]
    if not sep:
        return Override(text=text, parts=tuple(key.split(".")), value=_NO_VALUE, action=action), []
    yaml_feature = _yaml_feature(raw_value)
    if yaml_feature:
        return None, [
            Problem(
                path=key,
                value=text,
                message=f"the value uses a YAML {yaml_feature}, which an override cannot "
                "carry (it would be dropped or followed silently)",
                fix=f"quote the value if the character is meant literally: '{key}=\"{raw_value}\"'",
            )
        ]
    from omegaconf import OmegaConf  # here: importing it is most of a cold `hpcrl render`

    try:
        # OmegaConf types the value as YAML would; a fixed key keeps its own key syntax out.
        value = dict_container(OmegaConf.from_dotlist([f"v={raw_value}"]), resolve=False)["v"]
    except Exception as exc:  # yaml and OmegaConf errors alike: report, don't crash
        return None, [_bad_syntax(text, " ".join(f"cannot parse the value: {exc}".split())[:200])]
    return Override(text=text, parts=tuple(key.split(".")), value=value, action=action), []


def _yaml_feature(raw_value: str) -> str | None:
    """The YAML anchor, alias or tag in an override's value (``name=&a x`` would become
    ``x``), or None."""
    if not any(mark in raw_value for mark in "&*!"):
        return None
    import yaml

    names = {yaml.AnchorToken: "anchor (&)", yaml.AliasToken: "alias (*)", yaml.TagToken: "tag (!)"}
    try:
        for token in yaml.scan(raw_value):
            if type(token) in names:
                return names[type(token)]
    except yaml.YAMLError:
        return None  # not YAML at all: OmegaConf's parser says what is wrong
    return None


def apply_overrides(
    cfg: DictConfig, texts: typing.Sequence[str], schema: type, known: KnownKey = None
) -> tuple[DictConfig, list[Problem], set[str]]:
    """Apply overrides in order (later wins) to a merged config.

    Returns the config, problems for bad overrides and the alias spellings the overrides used
    (see ``hpcrl.config.aliases``). ``known(parts)`` says whether a key outside the schema is
    still one the loader knows (NeMo RL keys it accepts or rejects by name).
    """
    problems: list[Problem] = []
    spellings: set[str] = set()
    for text in texts:
        override, parse_problems = parse_override(text)
        problems += parse_problems
        if override is None:
            continue
        spellings |= spellings_of(override.parts)
        parts = rename_path(override.parts)
        if parts != override.parts:
            problems.append(alias_warning(".".join(override.parts), ".".join(parts)))
        override = attrs.evolve(override, parts=parts)
        problems += _apply_one(cfg, override, schema, known)
    return cfg, problems, spellings


def _apply_one(cfg: DictConfig, override: Override, schema: type, known: KnownKey) -> list[Problem]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    key = ".".join(override.parts)
    present = _holds(cfg, override.parts)
    if override.action == "delete":
        return _delete(cfg, override, present)
    if override.action == "add" and present:
        current = _as_written(cfg, override.parts)  # never resolved: it may read a secret
        return [
            Problem(
                path=key,
                value=override.text,
                message=f"+ adds a key, but the config already sets it (to {_shown(current)})",
                fix=f"write {key}=... or ++{key}=... to change it",
            )
        ]
    schema_problem = check_key_in_schema(override.parts, schema, override.text)
    # known() only for keys outside the schema: it may read the NeMo RL key registry
    if schema_problem is not None and (known is None or not known(override.parts)):
        return [schema_problem]
    try:
        OmegaConf.update(cfg, key, _absolute_data_path(override), merge=True, force_add=True)
    except OmegaConfBaseException as exc:
        return [_bad_syntax(override.text, f"cannot apply it: {exc}".splitlines()[0])]
    return []


def _delete(cfg: DictConfig, override: Override, present: bool) -> list[Problem]:
    from omegaconf import OmegaConf

    key = ".".join(override.parts)
    if not present:
        return [
            Problem(
                path=key,
                value=override.text,
                message="~ deletes a key, but the config does not set it",
                fix="check the key's spelling (the full dotted path), or drop the override",
            )
        ]
    parent = OmegaConf.select(cfg, ".".join(override.parts[:-1])) if override.parts[:-1] else cfg
    current = dict_container(parent, resolve=False)[override.parts[-1]]
    if override.value is not _NO_VALUE and current != override.value:
        return [
            Problem(
                path=key,
                value=override.text,
                message=f"~{key}=VALUE deletes the key only if it holds VALUE; it holds {_shown(current)}",
                fix=f"write ~{key} to delete it whatever it holds",
            )
        ]
    del parent[override.parts[-1]]
    return []


def _holds(cfg: DictConfig, parts: tuple[str, ...]) -> bool:
    from omegaconf import OmegaConf

    node: Any = cfg
    for part in parts:
        if not OmegaConf.is_dict(node) or part not in node:
            return False
        node = node._get_node(part)
        if node._is_interpolation() and part != parts[-1]:
            return False  # below an interpolation: not a key of the file
    return True


def _as_written(cfg: DictConfig, parts: tuple[str, ...]) -> Any:
    """The value at ``parts`` (a key ``_holds``) as the files and overrides wrote it."""
    from omegaconf import OmegaConf

    node: Any = cfg
    for part in parts:
        node = node._get_node(part)
    return (
        OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node._value()
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
            return _unknown_override_key(parts, depth, list(hints), text, schema)
        field_type = hints[part]
    return None


def _unknown_override_key(
    parts: tuple[str, ...], depth: int, known: list[str], text: str, schema: type
) -> Problem:
    """A sibling with a close name first (``polcy`` -> ``policy``); else the keys below the
    same parent that end like the typed key (``policy.lr`` -> ``policy.optimizer.kwargs.lr``)."""
    from hpcrl.config.key_index import keys_ending_like
    from hpcrl.config.nemo_rl_filter import nemo_rl_parts
    from hpcrl.config.nemo_rl_keys import registry

    # NeMo RL's keys of the section too: a typo of one (use_tqdmm) finds it
    nemo_rl_keys = registry().children(nemo_rl_parts(parts[:depth])) if depth else []
    guess = did_you_mean(parts[depth], [*known, *nemo_rl_keys])
    parent = ".".join(parts[:depth]) or "the top level"
    deeper = [] if guess else keys_ending_like(schema, parts, depth)
    if guess:
        fix = "did you mean " + ".".join((*parts[:depth], guess, *parts[depth + 1 :])) + "?"
    elif deeper:
        fix = "did you mean " + " or ".join(deeper) + "?"
    else:
        fix = f"keys allowed under {parent}: {', '.join(known)}"
    return Problem(
        path=".".join(parts),
        value=text,
        message=f"override names a key that does not exist ({parts[depth]!r} under {parent})",
        fix=fix,
    )


def _absolute_data_path(override: Override) -> Any:
    # An override is typed in a shell: relative paths mean the current folder.
    is_data_path = override.parts in {("data", "train_path"), ("data", "val_path")}
    if is_data_path and isinstance(override.value, str) and "${" not in override.value:
        if "://" in override.value:
            return override.value  # a URL stays one (the plan says a data file is local)
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
