"""``<run_dir>/metrics.jsonl``: one JSON object per training step, its one writer and its
one reader (the format lives here only).

The driver writes it (``MetricsWriter``): one object per step, written and flushed as soon
as the step ends so nothing is lost when a job dies; a resumed run first drops the steps it
runs again. ``hpcrl report``, ``status`` and ``--wait`` read it (``read_metrics_file``).
Keys: ``step`` (int) and whatever the step recorded (``time_step_s``, ``tokens_per_s``,
``loss``, ``reward_mean``, ``peak_gpu_mem_gb`` (null without a GPU), ``peak_host_rss_gb``,
...); any may be missing or null.

Whatever the file holds, reading it never fails and never guesses silently: a line that is
not a JSON object with an integer ``step`` is skipped and each skip is reported as a note. A
torn last line (the job is still writing it) is skipped without a note. Records are taken in
step order; a step written twice (a requeued attempt redoing it) counts once, with its
later line. Steps between 1 and the last one written that have no line (the file was cut or
deleted while the job wrote it) are named in a note, with how many steps the figures cover.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.shared_methods import SharedMethods

METRICS_FILE = "metrics.jsonl"
MAX_NOTED_LINES = 5


class MetricsWriter:
    """Appends one JSON object per step; a resumed run appends to the same file, after
    ``drop_steps_from`` removed what it is about to run again."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def drop_steps_from(self, first_step: int) -> int:
        """Remove the records of steps ``>= first_step`` (an earlier attempt ran them after
        the checkpoint this run resumes from, and they run again: none is written twice), and
        any line that is not a record (one cut short when a job died). Returns how many."""
        from hpcrl.run.atomic_files import write_file

        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return 0
        steps = [(line, _step_of(line)) for line in lines]
        kept = [line for line, step in steps if step is not None and step < first_step]
        if len(kept) < len(lines):
            write_file(self.path, "".join(line + "\n" for line in kept))
        return len(lines) - len(kept)

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps({key: _plain(value) for key, value in record.items()}, sort_keys=False)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _plain(value: Any) -> Any:
    """JSON-safe: floats stay floats, NaN/inf become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _plain(value.item())
    return value


@attrs.frozen(kw_only=True)
class MetricsFile(SharedMethods):
    """The usable records of a metrics file, in step order, and what was skipped reading it."""

    records: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()


def read_metrics_file(run_dir: Path) -> MetricsFile:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return MetricsFile(records=())
    if not path.is_file():  # a folder, a FIFO: never opened (a FIFO would block)
        return MetricsFile(records=(), notes=(f"{path} is not a regular file; not read",))
    try:
        data = path.read_bytes()
    except OSError as error:
        return MetricsFile(records=(), notes=(f"{path}: cannot be read: {error.strerror}",))
    records, skipped = _parse_lines(data)
    notes = []
    if skipped:
        shown = "; ".join(skipped[:MAX_NOTED_LINES]) + (
            "; ..." if len(skipped) > MAX_NOTED_LINES else ""
        )
        notes.append(f"{path}: skipped {len(skipped)} unreadable line(s) ({shown})")
    ordered = _in_step_order(records)
    missing = missing_steps([record["step"] for record in ordered])
    if missing:
        notes.append(missing_steps_note(path, missing, ordered[-1]["step"], bool(skipped)))
    return MetricsFile(records=ordered, notes=tuple(notes))


def missing_steps(steps: Sequence[int]) -> list[tuple[int, int]]:
    """(first, last) of each run of training steps that has no line, between step 1 and the
    last step written (``steps`` in order; step 0 is validation before training). A job
    writes every step from 1 on; a resumed one rewrites those after its checkpoint."""
    gaps, expected = [], 1
    for step in (step for step in steps if step >= 1):
        if step > expected:
            gaps.append((expected, step - 1))
        expected = step + 1
    return gaps


def missing_steps_note(
    path: Path, gaps: list[tuple[int, int]], last: int, skipped_lines: bool
) -> str:
    count = sum(high - low + 1 for low, high in gaps)
    ranges = [str(low) if low == high else f"{low}-{high}" for low, high in gaps]
    shown = ", ".join(ranges[:MAX_NOTED_LINES]) + (", ..." if len(ranges) > MAX_NOTED_LINES else "")
    why = (
        "unreadable (see above) or"
        if skipped_lines
        else "the file was changed or cut while the job wrote it:"
    )
    return (
        f"{path}: lines are missing: {count:,} of the {last:,} steps up to step {last:,} have "
        f"none (steps {shown}), so the figures cover {last - count:,} steps; {why} the job's "
        "own log (hpcrl logs --driver) shows every step"
    )


def _parse_lines(data: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    lines = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    torn = len(lines) - 1 if lines[-1].strip() else None  # no newline after the last line yet
    records, skipped = [], []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        record, problem = _parse_line(raw)
        if problem is None:
            records.append(record)
        elif number - 1 != torn or problem != "not JSON":
            skipped.append(f"line {number}: {problem}")
    return records, skipped


def _parse_line(raw: bytes) -> tuple[dict[str, Any], str | None]:
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return {}, "not UTF-8"
    if "\x00" in text:
        return {}, "holds NUL bytes"
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, too many digits
        return {}, "not JSON"
    if not isinstance(record, dict):
        return {}, f"a JSON {type(record).__name__}, not an object"
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return {}, f"no step number (step = {step!r:.20})"
    return record, None


def _in_step_order(records: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:  # file order: a step's later line wins
        by_step[record["step"]] = record
    return tuple(by_step[step] for step in sorted(by_step))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All usable step records of a run, in step order (see ``read_metrics_file``)."""
    return list(read_metrics_file(run_dir).records)


def last_metrics(run_dir: Path) -> dict[str, Any] | None:
    records = read_metrics_file(run_dir).records
    return records[-1] if records else None


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None
