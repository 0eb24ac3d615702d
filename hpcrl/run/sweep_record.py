"""A sweep folder's ``sweep.json``: the submitted sweep's points and their run folders.

``hpcrl sweep`` writes it (``hpcrl.submit.sweep_launch``); ``hpcrl status``, ``report`` and
the run-folder lock read it. Point i of the sweep is array task i and runs in
``<sweep_dir>/point-<i>/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.errors import UserError
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.run.atomic_files import write_file

SWEEP_RECORD_NAME = "sweep.json"
SWEEP_RECORD_SCHEMA = 1


class SweepError(UserError):
    """A malformed --grid/--zip option, a sweep with invalid points, or an unreadable
    ``sweep.json``."""

    exit_code = 2  # like any other mistake in what the command was given


@attrs.frozen
class SweepPoint(SharedMethods):
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


@attrs.frozen(kw_only=True)
class SweepRecord(SharedMethods):
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
