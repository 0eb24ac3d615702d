"""Sweep points from ``--grid`` / ``--zip`` options (the sweep folder's ``sweep.json`` is
``hpcrl.run.sweep_record``).

``--grid key=v1,v2`` axes multiply; all ``--zip`` options form one axis whose keys move
together (equal lengths). Point i of the sweep is array task i and runs in
``<sweep_dir>/point-<i>/``; its values reach the recipe as ordinary ``key=value`` overrides,
after the user's own, so every point is one resolved recipe.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence

from hpcrl.run.sweep_record import SweepError, SweepPoint

MAX_POINTS = 1000


def split_values(text: str) -> list[str]:
    """``a,b,[c,d]`` → ``["a", "b", "[c,d]"]``: commas inside brackets belong to a value."""
    values: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append("".join(current))
            current = []
        else:
            current.append(char)
    values.append("".join(current))
    return values


def parse_axis(option: str, spec: str) -> tuple[str, list[str]]:
    key, equals, text = spec.partition("=")
    key = key.strip()
    if not equals or not key:
        raise SweepError(
            f"{option} {spec!r}: expected KEY=V1,V2,... (e.g. {option} grpo.seed=1,2,3)"
        )
    values = [value.strip() for value in split_values(text)]
    if any(not value for value in values):
        raise SweepError(f"{option} {spec!r}: empty value in the list")
    return key, values


def build_points(grid: Sequence[str], zips: Sequence[str] = ()) -> list[SweepPoint]:
    """Every point of the sweep, in a fixed order (grid axes in the order given, zip last)."""
    axes: list[list[dict[str, str]]] = []
    seen: set[str] = set()
    for spec in grid:
        key, values = parse_axis("--grid", spec)
        _check_new_key(key, seen)
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            raise SweepError(
                f"--grid {key}: {', '.join(repeated)} listed more than once (two points would "
                "be the same run)",
                fix="list each value once",
            )
        axes.append([{key: value} for value in values])
    if zips:
        zipped = [parse_axis("--zip", spec) for spec in zips]
        lengths = {key: len(values) for key, values in zipped}
        if len(set(lengths.values())) != 1:
            raise SweepError(f"--zip lists must have equal lengths, got {lengths}")
        for key, _ in zipped:
            _check_new_key(key, seen)
        combos = list(zip(*(v for _, v in zipped), strict=True))
        if len(set(combos)) < len(combos):
            raise SweepError(
                f"--zip {', '.join(lengths)}: the same values appear twice at one position "
                "(two points would be the same run)",
                fix="make each position of the zipped lists differ",
            )
        axes.append([dict(zip(lengths, combo, strict=True)) for combo in combos])
    if not axes:
        raise SweepError("a sweep needs at least one --grid or --zip option")
    num_points = math.prod(len(axis) for axis in axes)
    if num_points > MAX_POINTS:
        raise SweepError(
            f"{num_points} points; one job array holds at most {MAX_POINTS} (Slurm's default "
            "MaxArraySize is 1001), and each point is planned before anything is submitted",
            fix="sweep fewer values, or split the sweep into several",
        )
    return [
        SweepPoint(index, {k: v for part in point for k, v in part.items()})
        for index, point in enumerate(itertools.product(*axes))
    ]


def _check_new_key(key: str, seen: set[str]) -> None:
    if key in seen:
        raise SweepError(f"{key} is swept twice; give each key one --grid or --zip")
    seen.add(key)


def sweep_hash(
    recipe_source: str, cluster: str, overrides: Sequence[str], points: Sequence[SweepPoint]
) -> str:
    """8 hex digits naming the sweep folder: same inputs, same name."""
    payload = json.dumps([recipe_source, cluster, list(overrides), [p.values for p in points]])
    return hashlib.sha256(payload.encode()).hexdigest()[:8]
