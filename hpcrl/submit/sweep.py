"""Sweep points from ``--grid`` / ``--zip`` options, and the sweep folder's ``sweep.json``.

``--grid key=v1,v2`` axes multiply; all ``--zip`` options form one axis whose keys move
together (equal lengths). Point i of the sweep is array task i and runs in
``<sweep_dir>/point-<i>/``; its values reach the recipe as ordinary ``key=value`` overrides,
after the user's own, so every point is one resolved recipe.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcrl.files import write_file

SWEEP_RECORD_NAME = "sweep.json"
SWEEP_RECORD_SCHEMA = 1


class SweepError(ValueError):
    """A malformed --grid/--zip option or a sweep with invalid points (all listed)."""


@attrs.frozen
class SweepPoint:
    index: int
    values: dict[str, str]  # dotted key -> value as typed (an override's right-hand side)

    @property
    def run_dir_name(self) -> str:
        return f"point-{self.index}"

    @property
    def overrides(self) -> tuple[str, ...]:
        return tuple(f"{key}={value}" for key, value in self.values.items())

    def describe(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.values.items())


def split_values(text: str) -> list[str]:
    """``a,b,[c,d]`` → ``["a", "b", "[c,d]"]``: commas inside brackets belong to a value."""
    values, depth, current = [], 0, []
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
        axes.append([{key: value} for value in values])
    if zips:
        zipped = [parse_axis("--zip", spec) for spec in zips]
        lengths = {key: len(values) for key, values in zipped}
        if len(set(lengths.values())) != 1:
            raise SweepError(f"--zip lists must have equal lengths, got {lengths}")
        for key, _ in zipped:
            _check_new_key(key, seen)
        axes.append(
            [
                dict(zip(lengths, combo, strict=True))
                for combo in zip(*(v for _, v in zipped), strict=True)
            ]
        )
    if not axes:
        raise SweepError("a sweep needs at least one --grid or --zip option")
    combos = itertools.product(*axes)
    return [
        SweepPoint(index, {k: v for part in combo for k, v in part.items()})
        for index, combo in enumerate(combos)
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


# --------------------------------------------------------------------------- sweep.json
@attrs.frozen(kw_only=True)
class SweepRecord:
    """A submitted sweep: its points (with their run folders, relative to the sweep folder)."""

    name: str
    recipe_source: str
    cluster: str
    overrides: tuple[str, ...]
    swept_keys: tuple[str, ...]
    points: tuple[SweepPoint, ...]
    array_job_id: str | None = None
    submitted_at: str | None = None
    schema: int = SWEEP_RECORD_SCHEMA

    def point_run_dirs(self, sweep_dir: Path) -> list[Path]:
        return [Path(sweep_dir) / point.run_dir_name for point in self.points]


def write_sweep_record(sweep_dir: Path, record: SweepRecord) -> Path:
    data: dict[str, Any] = attrs.asdict(record, recurse=False)
    data["overrides"] = list(record.overrides)
    data["swept_keys"] = list(record.swept_keys)
    data["points"] = [
        {"index": p.index, "run_dir": p.run_dir_name, "values": p.values} for p in record.points
    ]
    return write_file(Path(sweep_dir) / SWEEP_RECORD_NAME, json.dumps(data, indent=2) + "\n")


def read_sweep_record(sweep_dir: Path) -> SweepRecord:
    data = json.loads((Path(sweep_dir) / SWEEP_RECORD_NAME).read_text())
    if data.get("schema") != SWEEP_RECORD_SCHEMA:
        raise SweepError(f"{sweep_dir}/{SWEEP_RECORD_NAME}: unknown schema {data.get('schema')!r}")
    points = tuple(SweepPoint(p["index"], dict(p["values"])) for p in data.pop("points"))
    data["overrides"] = tuple(data["overrides"])
    data["swept_keys"] = tuple(data["swept_keys"])
    return SweepRecord(points=points, **data)


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_RECORD_NAME).is_file()
