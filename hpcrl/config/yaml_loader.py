"""hpcrl's YAML loader: PyYAML's safe loader, reading a file the way OmegaConf's loader does.

A config reads the same whether or not it needs OmegaConf afterwards, yet a plain file never
imports omegaconf (~40 ms of ``hpcrl validate``). What OmegaConf's loader (2.4) changes from
PyYAML's safe loader, and so this one does too:

- YAML 1.2 floats: ``1e-5`` and ``1_000.5e3`` are floats (YAML 1.1 needs a dot: ``1.0e-5``);
- no timestamps: ``2024-01-01`` stays a string;
- a key written twice in one mapping is an error (PyYAML keeps the last), and a key written in
  the mapping wins over the same key merged in by ``<<:``, in the written key's place;
- recursive aliases are an error, and so is a document that expands past 10,000 nodes, or
  past 100x its own size through aliases over 1,000 nodes ("billion laughs"); the limit
  follows OmegaConf's variable ``OMEGACONF_MAX_YAML_EXPANDED_NODES`` (a number, or none);
- ``!!python/object/apply:pathlib.Path`` (and PosixPath, WindowsPath) build paths.

``tests/config/test_yaml_loader.py`` compares it with OmegaConf's loader over every NeMo RL
example config, the shipped recipes and profiles, and the error cases.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import yaml

try:
    from yaml import CSafeLoader as _SafeLoader  # libyaml's parser: ~5x faster
except ImportError:  # pragma: no cover  (a PyYAML built without libyaml)
    from yaml import SafeLoader as _SafeLoader

STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"
VALUE_TAG = "tag:yaml.org,2002:value"
MAX_NODES_VARIABLE = "OMEGACONF_MAX_YAML_EXPANDED_NODES"
DEFAULT_MAX_NODES = 10_000
MAX_ALIAS_GROWTH = 100  # expanded / written nodes, checked above MIN_NODES_FOR_GROWTH
MIN_NODES_FOR_GROWTH = 1_000

# YAML 1.2's floats besides YAML 1.1's: an exponent without a dot, base 60, .inf, .nan.
_FLOAT = re.compile(
    r"""^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_PATH_CLASSES = (
    ("Path", pathlib.Path),
    ("PosixPath", pathlib.PosixPath),
    ("WindowsPath", pathlib.WindowsPath),
)


def load_yaml_text(stream: Any) -> Any:
    """The document in ``stream`` (a file or a string) as plain data; None when empty."""
    return yaml.load(stream, Loader=ConfigLoader)  # noqa: S506  (a safe loader)


class ConfigLoader(_SafeLoader):
    """See the module docstring."""

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_recursion(node)
        _refuse_expansion(node, _max_nodes())
        return super().construct_document(node)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # PyYAML's own merging changed in 6.0.2 (it drops repeated keys by object identity):
        # spelled out here as OmegaConf does it, whatever PyYAML is installed.
        written = _written_keys(node)
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        own: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged += self._merged_pairs(node, value_node)
                continue
            if key_node.tag == VALUE_TAG:  # the `=` key is a plain key
                key_node.tag = STR_TAG
            own.append((key_node, value_node))
        if merged:
            merged = [
                (key_node, value_node)
                for key_node, value_node in merged
                if key_node.tag != STR_TAG or key_node.value not in written
            ]
        node.value = merged + own

    def _merged_pairs(
        self, node: yaml.MappingNode, value_node: yaml.Node
    ) -> list[tuple[yaml.Node, yaml.Node]]:
        """What ``<<: value_node`` brings in; from a list, earlier mappings win (last built)."""
        if isinstance(value_node, yaml.MappingNode):
            self.flatten_mapping(value_node)
            return list(value_node.value)
        if not isinstance(value_node, yaml.SequenceNode):
            raise _merge_error(node, "a mapping or list of mappings", value_node)
        pairs: list[tuple[yaml.Node, yaml.Node]] = []
        for subnode in value_node.value:
            if not isinstance(subnode, yaml.MappingNode):
                raise _merge_error(node, "a mapping", subnode)
            self.flatten_mapping(subnode)
            pairs = list(subnode.value) + pairs
        return pairs


def _merge_error(
    node: yaml.MappingNode, expected: str, found: yaml.Node
) -> yaml.constructor.ConstructorError:
    """PyYAML's own words for a ``<<:`` value that cannot be merged."""
    return yaml.constructor.ConstructorError(
        "while constructing a mapping",
        node.start_mark,
        f"expected {expected} for merging, but found {found.id}",
        found.start_mark,
    )


def _written_keys(node: yaml.MappingNode) -> set[str]:
    """The mapping's own string keys; one written twice is an error."""
    written: set[str] = set()
    for key_node, _ in node.value:
        if key_node.tag != STR_TAG:
            continue
        if key_node.value in written:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key_node.value}",
                key_node.start_mark,
            )
        written.add(key_node.value)
    return written


def _max_nodes() -> int | None:
    text = os.environ.get(MAX_NODES_VARIABLE)
    if text is None:
        return DEFAULT_MAX_NODES
    if text.strip().lower() == "none":
        return None
    try:
        limit = int(text.strip())
    except ValueError:
        limit = 0
    if limit <= 0:
        raise ValueError(
            f"Invalid value for {MAX_NODES_VARIABLE}: {text.strip()!r}. "
            "Set it to a positive integer or 'none'."
        )
    return limit


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _refuse_recursion(root: yaml.Node) -> None:
    """An alias inside the node it names would expand forever."""
    done: set[int] = set()
    open_ids: set[int] = set()

    def visit(node: yaml.Node) -> None:
        if id(node) in done:
            return
        if id(node) in open_ids:
            raise yaml.constructor.ConstructorError(
                None, None, "YAML recursive aliases are not supported.", node.start_mark
            )
        open_ids.add(id(node))
        for child in _children(node):
            visit(child)
        open_ids.discard(id(node))
        done.add(id(node))

    visit(root)


def _refuse_expansion(root: yaml.Node, limit: int | None) -> None:
    """Aliases repeat a node: the document built may be far larger than the text."""
    if limit is None:
        return
    expanded = _expanded_count(root, limit)
    if expanded > limit:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"YAML node expansion exceeds the configured limit of {limit}. Increase "
            f"{MAX_NODES_VARIABLE} (a positive integer; 'none' only for trusted input).",
            root.start_mark,
        )
    written = _written_count(root, set())
    if expanded > MIN_NODES_FOR_GROWTH and expanded > written * MAX_ALIAS_GROWTH:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"YAML aliases expand the document from {written} nodes to {expanded} nodes, "
            f"exceeding the supported ratio of {MAX_ALIAS_GROWTH}x. For trusted input, set "
            f"{MAX_NODES_VARIABLE}=none.",
            root.start_mark,
        )


def _expanded_count(root: yaml.Node, limit: int) -> int:
    """Nodes of the built document (an alias counts its whole node again); stops past limit."""
    counts: dict[int, int] = {}

    def count(node: yaml.Node) -> int:
        if id(node) not in counts:
            total = 1
            for child in _children(node):
                total += count(child)
                if total > limit:
                    break
            counts[id(node)] = total
        return counts[id(node)]

    return count(root)


def _written_count(node: yaml.Node, seen: set[int]) -> int:
    if id(node) in seen:
        return 0
    seen.add(id(node))
    return 1 + sum(_written_count(child, seen) for child in _children(node))


def _construct_path(cls: type[pathlib.PurePath]) -> Any:
    def construct(loader: yaml.BaseLoader, node: yaml.SequenceNode) -> pathlib.PurePath:
        return cls(*loader.construct_sequence(node))

    return construct


def _configure(loader: type[yaml.BaseLoader]) -> None:
    """YAML 1.2 floats after PyYAML's own resolvers, timestamps dropped, paths built."""
    loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in loader.yaml_implicit_resolvers.items()
    }
    for module in ("pathlib", "pathlib._local"):  # Python 3.13 pickles paths as pathlib._local
        for name, cls in _PATH_CLASSES:
            tag = f"tag:yaml.org,2002:python/object/apply:{module}.{name}"
            loader.add_constructor(tag, _construct_path(cls))


_configure(ConfigLoader)
