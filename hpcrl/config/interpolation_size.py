"""How long each value will be once its ``${...}`` are resolved, and how many lookups that
takes, known before resolving.

Interpolation can copy a value into another many times over: ``s1: ${s0}${s0}``, ``s2:
${s1}${s1}`` ... doubles at each key, so 40 short lines resolve to a terabyte, and OmegaConf
builds it in memory on the login node. Resolving one key on its own (``OmegaConf.select``,
which the loader uses to find every bad key) also looks each reference up again every time
it is used: ``s14`` alone took 11 s here, ``s39`` would take years. This walks the unresolved
config once (each key's numbers computed once, from those of the keys it refers to) and finds
the values that would resolve to more than ``MAX_VALUE_CHARS`` characters or take more than
``MAX_LOOKUPS`` lookups, and configs whose values add up to more than ``MAX_TOTAL_CHARS``, so
the loader leaves those keys unresolved and says why.

The estimate is an upper bound where it matters: a reference counts as the whole value it
names; a resolver call (``${mul:a,b}``, ``${oc.env:X}``) as its own text plus what it refers
to (and, for ``oc.env``, the variable's value). References that name nothing count as empty
(resolution reports them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from hpcrl.config.aliases import is_alias_path
from hpcrl.config.errors import Problem

#: One value (a path, a name, a prompt, a chat template) is far below this.
MAX_VALUE_CHARS = 1 << 20
#: A resolved recipe or profile is of the order of its files (each at most 1 MiB).
MAX_TOTAL_CHARS = 16 << 20
#: NeMo RL's configs need at most 5 lookups for a key (a reference to a key that refers on);
#: a chain of about 60 already exhausts Python's recursion limit in OmegaConf's ``select``.
MAX_LOOKUPS = 40
_NODE_REFERENCE = re.compile(r"\s*(\.*)([A-Za-z_$][\w$-]*(?:\.[\w$-]+|\[\d+\])*)?\s*")
_KEY_PART = re.compile(r"[^.\[\]]+|\[(\d+)\]")

Parts = tuple[str | int, ...]


def oversized_values(
    raw: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[Parts, Problem | None]:
    """The keys to leave unresolved, each with its problem (None for keys that only grow
    because a key they use does: the problem names that one)."""
    sizes = _Sizes(raw, os.environ if environ is None else environ)
    leaves = [parts for parts in _leaf_paths(raw, ()) if not is_alias_path(parts)]
    oversized = {
        parts for parts in leaves
        if sizes.of(parts) > MAX_VALUE_CHARS or sizes.lookups_of(parts) > MAX_LOOKUPS
    }  # fmt: skip
    found: dict[Parts, Problem | None] = {
        parts: None
        if any(used in oversized for used in sizes.references_of(parts))
        else _too_long(parts, sizes.of(parts), sizes.lookups_of(parts), len(oversized))
        for parts in oversized
    }
    total = sum(sizes.of(parts) for parts in leaves if parts not in oversized)
    if total > MAX_TOTAL_CHARS:
        largest = max((p for p in leaves if p not in oversized), key=sizes.of)
        found[largest] = _too_much(largest, sizes.of(largest), total)
    return found


def _too_long(parts: Parts, size: int, lookups: int, num_oversized: int) -> Problem:
    others = num_oversized - 1
    more = f"; {others} more key(s) built from it are left out too" if others > 0 else ""
    if size > MAX_VALUE_CHARS:
        what = (
            f"resolve to about {_chars(size)} characters, more than any value needs (at most "
            f"{MAX_VALUE_CHARS:,})"
        )
    else:
        what = f"take {_chars(lookups)} lookups to resolve (at most {MAX_LOOKUPS:,})"
    return Problem(
        path=_dotted(parts),
        message=f"its ${{...}} references {what}: values that use each other more than once, "
        f"or through a long chain of keys, grow with every level{more}",
        fix="refer to each value once (${a.b} copies the whole value of a.b), or write it out",
    )


def _too_much(parts: Parts, size: int, total: int) -> Problem:
    return Problem(
        path=_dotted(parts),
        message=f"the config's ${{...}} references resolve to about {_chars(total)} characters "
        f"in all (at most {MAX_TOTAL_CHARS:,}); this key's value alone is {_chars(size)}, "
        "and keys that copy it multiply it",
        fix="refer to large values once, or write the values out",
    )


def _chars(size: int) -> str:
    return f"{size:,}" if size < 10**15 else f"{size:.3g}"


def _dotted(parts: Parts) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top>"


def _leaf_paths(node: Any, parts: Parts) -> Iterator[Parts]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaf_paths(value, (*parts, key))
    elif isinstance(node, list) and node:
        for index, value in enumerate(node):
            yield from _leaf_paths(value, (*parts, index))
    else:
        yield parts


class _Sizes:
    """Resolved size and lookups of each node, computed once from those of the nodes it
    refers to. A reference cycle counts as nothing (OmegaConf reports it); a chain deeper than
    ``MAX_DEPTH`` is cut there and counts as too many lookups (it is refused either way)."""

    MAX_DEPTH = 4 * MAX_LOOKUPS

    def __init__(self, raw: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        self._raw, self._environ = raw, environ
        self._known: dict[Parts, tuple[int, int]] = {}  # parts -> (size, lookups)
        self._references: dict[Parts, list[Parts]] = {}
        self._visiting: set[Parts] = set()

    def references_of(self, parts: Parts) -> list[Parts]:
        return self._references.get(parts, [])

    def of(self, parts: Parts) -> int:
        """Characters of the value at ``parts`` once resolved (about)."""
        return self._measure(parts)[0]

    def lookups_of(self, parts: Parts) -> int:
        """Lookups resolving ``parts`` alone takes: one per reference, plus what resolving
        the referenced value takes, every time it is referred to (nothing is cached)."""
        return self._measure(parts)[1]

    def _measure(self, parts: Parts) -> tuple[int, int]:
        if parts in self._known:
            return self._known[parts]
        if parts in self._visiting:
            return 0, 0  # a cycle
        if len(self._visiting) > self.MAX_DEPTH:
            return 0, MAX_LOOKUPS + 1
        self._visiting.add(parts)
        try:
            measured = self._measure_node(parts, _node_at(self._raw, parts))
        finally:
            self._visiting.discard(parts)
        self._known[parts] = measured
        return measured

    def _measure_node(self, parts: Parts, node: Any) -> tuple[int, int]:
        if isinstance(node, dict | list):
            keys = list(node) if isinstance(node, dict) else range(len(node))
            size = lookups = 0
            for key in keys:
                child_size, child_lookups = self._measure((*parts, key))
                size += len(str(key)) + 2 + child_size
                lookups += child_lookups
            return size, lookups
        if isinstance(node, str) and "${" in node:
            return self._measure_text(parts, node)
        return (len(str(node)) if node is not None else 0), 0

    def _measure_text(self, parts: Parts, text: str) -> tuple[int, int]:
        size = lookups = 0
        for literal, body in _split_interpolations(text):
            size += len(literal)
            if body is None:
                continue
            reference = _NODE_REFERENCE.fullmatch(body)
            if reference is not None and reference.group(2):
                target = _target(parts, reference.group(1), reference.group(2))
                self._references.setdefault(parts, []).append(target)
                target_size, target_lookups = self._measure(target)
                size, lookups = size + target_size, lookups + 1 + target_lookups
            else:  # a resolver call: its text, what it refers to, a variable's value
                body_size, body_lookups = self._measure_text(parts, body)
                size += body_size + self._env_value_size(body)
                lookups += body_lookups
        return size, lookups

    def _env_value_size(self, body: str) -> int:
        name, _, rest = body.partition(":")
        if name.strip() != "oc.env":
            return 0
        variable = rest.split(",", 1)[0].strip().strip("'\"")
        return len(self._environ.get(variable, ""))


def _split_interpolations(text: str) -> Iterator[tuple[str, str | None]]:
    """(literal text, the body of the ``${...}`` after it or None) pairs of ``text``;
    ``\\${`` is literal, nested ``${`` and braces are matched."""
    start = 0
    index = text.find("${")
    while index != -1:
        if index > 0 and text[index - 1] == "\\":
            index = text.find("${", index + 2)
            continue
        end = _closing_brace(text, index + 2)
        if end is None:
            break
        yield text[start:index], text[index + 2 : end]
        start = end + 1
        index = text.find("${", start)
    yield text[start:], None


def _closing_brace(text: str, position: int) -> int | None:
    depth = 1
    for index in range(position, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def _target(parts: Parts, dots: str, key: str) -> Parts:
    """The key a ``${...}`` in the value at ``parts`` names: absolute, or relative to the
    value's parent (``${.x}``) and further up (``${..x}``)."""
    base: Parts = parts[: len(parts) - len(dots)] if dots else ()
    keys: list[str | int] = []
    for match in _KEY_PART.finditer(key):
        keys.append(int(match.group(1)) if match.group(1) else match.group(0))
    return (*base, *(int(k) if isinstance(k, str) and k.isdigit() else k for k in keys))


def _node_at(raw: Any, parts: Parts) -> Any:
    node = raw
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and str(part) in node:
            node = node[str(part)]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return None
    return node
