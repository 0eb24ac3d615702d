"""How large a recipe or profile file may be, checked before it is parsed.

A recipe or profile is a few kilobytes: the largest NeMo RL config (``grpo_math_1B.yaml``
on main) is 25 KB and holds under 1,000 YAML nodes. Parsing a 16 MB file takes close to a
minute on a login node, and a file of a few KB can expand to millions of nodes through
aliases, so the size is checked first (from the file's metadata) and the node count and
nesting depth next (a streaming count that stops at the limit, aliases counted as what they
expand to), each with its own message, before the file is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcrl.config.errors import Problem

MAX_CONFIG_BYTES = 1 << 20
#: OmegaConf 2.4's own default limit, applied whatever the OmegaConf (2.3 has none) or its
#: OMEGACONF_MAX_YAML_EXPANDED_NODES says.
MAX_CONFIG_NODES = 10_000
#: OmegaConf builds and resolves a config recursively: a list nested 100 deep ends in a
#: RecursionError (measured: 64 deep builds); NeMo RL's example configs nest 8 deep at most.
MAX_CONFIG_DEPTH = 32
CHECK_FIX = (
    "check that this is the file you meant: a recipe or profile holds a few hundred keys "
    "(data belongs in a data file, data.train_path)"
)


def yaml_size_problem(path: Path) -> Problem | None:
    """Why ``path`` is too large to be a recipe or profile (None: it is not)."""
    size = os.stat(path).st_size
    if size > MAX_CONFIG_BYTES:
        return Problem(
            path=str(path),
            message=f"{size:,} bytes: larger than any recipe or profile (at most "
            f"{MAX_CONFIG_BYTES:,} bytes; the largest NeMo RL config is 25 KB)",
            fix=CHECK_FIX,
        )
    with open(path, "rb") as stream:
        text = stream.read(MAX_CONFIG_BYTES + 1)
    nodes, depth = measure_yaml(text, MAX_CONFIG_NODES, depth_limit=MAX_CONFIG_DEPTH)
    if depth > MAX_CONFIG_DEPTH:
        return Problem(
            path=str(path),
            message=f"sequences and mappings nested more than {MAX_CONFIG_DEPTH} deep: deeper "
            "than any recipe or profile (NeMo RL's example configs nest 8 deep at most)",
            fix=CHECK_FIX,
        )
    if nodes > MAX_CONFIG_NODES:
        return Problem(
            path=str(path),
            message=f"more than {MAX_CONFIG_NODES:,} YAML nodes (keys, values and list items, "
            "aliases counted as what they expand to): more than any recipe or profile (the "
            "largest NeMo RL config holds under 1,000)",
            fix=CHECK_FIX,
        )
    return None


def count_yaml_nodes(text: bytes, limit: int) -> int:
    """The nodes of ``text`` with every alias expanded, counted from the parser's events
    without building them; stops once past ``limit``. A syntax error ends the count (the
    loader reports it with the parser's own words)."""
    return measure_yaml(text, limit, depth_limit=limit)[0]


def measure_yaml(text: bytes, limit: int, *, depth_limit: int) -> tuple[int, int]:
    """(nodes, deepest nesting) of ``text`` as ``count_yaml_nodes`` counts them; stops once
    past either limit."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    anchored: dict[str, int] = {}  # anchor -> nodes it expands to
    open_sizes: list[list] = []  # [nodes so far, anchor] of each open sequence or mapping
    count = depth = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.CollectionStartEvent):
                open_sizes.append([1, event.anchor])
                count += 1
                depth = max(depth, len(open_sizes))
            elif isinstance(event, yaml.ScalarEvent | yaml.AliasEvent | yaml.CollectionEndEvent):
                size, anchor = _closed(event, anchored, open_sizes)
                count += size if isinstance(event, yaml.AliasEvent) else 0
                count += 1 if isinstance(event, yaml.ScalarEvent) else 0
                if anchor:
                    anchored[anchor] = size
                if open_sizes:
                    open_sizes[-1][0] += size
            if count > limit or depth > depth_limit:
                break
    except yaml.YAMLError:
        pass
    return count, depth


def _closed(event: object, anchored: dict[str, int], open_sizes: list[list]) -> tuple[int, str]:
    """(nodes, anchor) of the node ``event`` completes."""
    import yaml

    if isinstance(event, yaml.CollectionEndEvent):
        size, anchor = open_sizes.pop()
        return size, anchor
    if isinstance(event, yaml.AliasEvent):
        return anchored.get(event.anchor or "", 1), ""
    return 1, getattr(event, "anchor", None) or ""
