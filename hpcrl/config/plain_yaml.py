"""A fast path for the common recipe: read YAML and resolve ``${a.b}`` without OmegaConf.

Importing OmegaConf (its interpolation grammar, ANTLR runtime) is a large share of a cold
``hpcrl render``. Most files need none of it: plain mappings, scalars and whole-value
references to other keys. These functions handle exactly that and answer None for anything
else (anchors, aliases, merge keys, tags, duplicate keys, non-string keys, ``???``, resolvers
like ``${oc.env:X}``, references inside longer strings, cycles, missing targets); the caller
then takes OmegaConf's path, so results and error messages stay OmegaConf's own.

Scalars are typed as OmegaConf's YAML loader types them: YAML 1.1 (SafeLoader) with floats
written without a dot (``1e-5``) read as floats, and dates left as strings.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

# Outside comment lines, these may start YAML features (anchors, aliases, merge keys, tags)
# whose handling is OmegaConf's loader's own.
_SPECIAL_TEXT = ("&", "*", "<<", "!")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*)\}")
_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class _NeedsOmegaConf(Exception):
    """The document uses something this fast path leaves to OmegaConf."""


def _loader_class() -> type:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class PlainLoader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = [key.value for key, _ in node.value]
            if len(keys) != len(set(keys)):
                raise _NeedsOmegaConf("duplicate key")
            return super().construct_mapping(node, deep=deep)

    PlainLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))
    PlainLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in PlainLoader.yaml_implicit_resolvers.items()
    }
    return PlainLoader


def read_plain_yaml(path: Path) -> Any:
    """The file's mapping, or None when OmegaConf must read it (FileNotFoundError passes)."""
    import yaml

    text = path.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    if any(special in line for line in lines for special in _SPECIAL_TEXT):
        return None
    try:
        data = yaml.load(text, Loader=_loader_class())  # noqa: S506 (a SafeLoader subclass)
    except (_NeedsOmegaConf, yaml.YAMLError):
        return None  # OmegaConf says what is wrong, in its words
    if not isinstance(data, dict) or not _plain(data):
        return None
    return data


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    if isinstance(value, list):
        return all(_plain(item) for item in value)
    if isinstance(value, str):
        return value != "???" and ("${" not in value or _REFERENCE.fullmatch(value) is not None)
    return value is None or isinstance(value, (bool, int, float))


def resolve_references(data: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of ``data`` with every whole-value ``${a.b}`` replaced by the value it names
    (itself resolved); None when anything needs OmegaConf."""
    if not _plain(data):
        return None
    try:
        return _resolved(data, data, ())
    except _NeedsOmegaConf:
        return None


def _resolved(value: Any, root: dict[str, Any], visiting: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {key: _resolved(item, root, visiting) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolved(item, root, visiting) for item in value]
    if isinstance(value, str) and value.startswith("${"):
        target = _REFERENCE.fullmatch(value).group(1)  # _plain let only whole references by
        if target in visiting:
            raise _NeedsOmegaConf("cycle")
        return _resolved(_lookup(root, target), root, visiting + (target,))
    return copy.copy(value)


def _lookup(root: dict[str, Any], dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise _NeedsOmegaConf(f"no key {dotted}")
        node = node[part]
    return node
