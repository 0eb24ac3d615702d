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
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.errors import UserError
from hpcrl.run.atomic_files import write_file

SWEEP_RECORD_NAME = "sweep.json"
SWEEP_RECORD_SCHEMA = 1
MAX_POINTS = 1000


class SweepError(UserError):
    """A malformed --grid/--zip option, a sweep with invalid points, or an unreadable
    ``sweep.json``."""

    exit_code = 2  # like any other mistake in what the command was given


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
    """``<sweep_dir>/sweep.json``; SweepError saying why when it cannot be read."""
    from hpcrl.run.job_record import DAMAGED_FIX, read_json_file

    path = Path(sweep_dir) / SWEEP_RECORD_NAME
    fix = DAMAGED_FIX.replace("the job", "the sweep").replace("its job", "its jobs")
    data = read_json_file(path, SweepError, fix)
    if not isinstance(data, dict) or data.get("schema") != SWEEP_RECORD_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise SweepError(
            f"{path}: not a sweep record of schema {SWEEP_RECORD_SCHEMA} (schema {schema!r})", fix
        )
    try:
        points = tuple(_point(entry) for entry in data.pop("points"))
        data["overrides"] = tuple(_strings(data["overrides"]))
        data["swept_keys"] = tuple(_strings(data["swept_keys"]))
        record = SweepRecord(points=points, **data)
    except (KeyError, TypeError, ValueError) as error:
        raise SweepError(f"{path}: damaged ({type(error).__name__}: {error})", fix) from None
    if not all(
        isinstance(getattr(record, name), str) for name in ("name", "recipe_source", "cluster")
    ):
        raise SweepError(f"{path}: damaged (name, recipe_source and cluster must be text)", fix)
    return record


def _point(entry: Any) -> SweepPoint:
    index, values = entry["index"], entry["values"]
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"point index {index!r} is not a number >= 0")
    if not isinstance(values, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in values.items()
    ):
        raise ValueError(f"point {index}: values must map keys to text")
    return SweepPoint(index, dict(values))


def _strings(items: Any) -> list[str]:
    if not isinstance(items, list | tuple | dict) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"expected a list of text, got {items!r:.60}")
    return list(items)


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_RECORD_NAME).is_file()
