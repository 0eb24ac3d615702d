"""A run or a sweep as report rows: one row per run (per sweep point), plus the rich table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from rich.table import Table

from hpcrl.config.errors import UserError
from hpcrl.report.metrics import RunSummary, ignored_values, summarize
from hpcrl.run.metrics_file import read_metrics_file
from hpcrl.run.sweep_record import is_sweep_dir, read_sweep_record


class ReportError(UserError):
    """Nothing to report on (not a run or sweep folder)."""


@attrs.frozen(kw_only=True)
class ReportRow:
    name: str  # the run folder's name (a sweep point's "point-<i>")
    run_dir: Path
    swept_values: dict[str, str]  # empty for a single run
    records: tuple[dict[str, Any], ...]  # metrics.jsonl, in step order
    summary: RunSummary
    notes: tuple[str, ...] = ()  # what reading and summarising left out, and why
    state: str = ""  # how the run ended (COMPLETED, FAILED, OOM, ...); '' never submitted
    shared_node: bool = False  # ran on a node at the same time as another point
    label: str = ""  # its name in plots when not its swept values (runs compared)


@attrs.frozen(kw_only=True)
class Report:
    title: str
    source_dir: Path
    swept_keys: tuple[str, ...]
    rows: tuple[ReportRow, ...]
    notes: tuple[str, ...] = ()  # about the report as a whole


def _row(run_dir: Path, swept_values: dict[str, str]) -> ReportRow:
    metrics = read_metrics_file(run_dir)
    return ReportRow(
        name=run_dir.name,
        run_dir=run_dir,
        swept_values=swept_values,
        records=metrics.records,
        summary=summarize(metrics.records),
        notes=metrics.notes + tuple(ignored_values(metrics.records)),
    )


def with_states(rows: tuple[ReportRow, ...]) -> tuple[ReportRow, ...]:
    from hpcrl.report.placement import placement_of, run_states, shared_nodes

    states = run_states([row.run_dir for row in rows])
    shared = shared_nodes([placement_of(row.run_dir) for row in rows])
    return tuple(
        _out_of_gpu_memory(attrs.evolve(row, state=state, shared_node=is_shared))
        for row, state, is_shared in zip(rows, states, shared, strict=True)
    )


def _out_of_gpu_memory(row: ReportRow) -> ReportRow:
    """A run that failed because a worker ran out of GPU memory (its attempt's cause,
    ``hpcrl.run.causes.GPU_OOM``) is an ``OOM`` row: its peak is the one it ran out at (no step
    may have recorded one), and the cause line is a note. A sweep over memory settings reads
    which points fit."""
    from hpcrl.run.causes import GPU_OOM, latest_cause

    if row.state != "FAILED":
        return row
    cause = latest_cause(row.run_dir)
    if cause is None or cause.kind != GPU_OOM:
        return row
    peaks = [p for p in (row.summary.peak_gpu_mem_gb, cause.peak_gpu_mem_gb) if p is not None]
    summary = attrs.evolve(row.summary, peak_gpu_mem_gb=max(peaks, default=None))
    return attrs.evolve(row, state="OOM", summary=summary, notes=(*row.notes, cause.line()))


def build_report(path: Path) -> Report:
    """The report of a run folder or of a sweep folder (every point)."""
    path = Path(path)
    rows, is_sweep = report_rows(path)
    if is_sweep:
        sweep = read_sweep_record(path)
        return Report(
            title=f"sweep {sweep.name}", source_dir=path, swept_keys=sweep.swept_keys,
            rows=with_states(rows),
        )  # fmt: skip
    return Report(title=f"run {path.name}", source_dir=path, swept_keys=(), rows=with_states(rows))


def report_rows(path: Path) -> tuple[tuple[ReportRow, ...], bool]:
    """The rows of a run folder (one) or a sweep folder (one per point, with its values),
    without their states; and whether it is a sweep. ReportError for neither."""
    if is_sweep_dir(path):
        sweep = read_sweep_record(path)
        rows = tuple(_row(path / point.run_dir_name, point.values) for point in sweep.points)
        return rows, True
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        raise ReportError(
            f"{path}: {what}", fix="give a run or sweep folder (hpcrl status lists them)"
        )
    if not any((path / name).exists() for name in ("metrics.jsonl", "job.json", "manifest.json")):
        raise ReportError(
            f"{path}: neither a run folder (metrics.jsonl, job.json) nor a sweep folder (sweep.json)",
            fix="give a run or sweep folder (hpcrl status lists them)",
        )
    return (_row(path, {}),), False


def format_number(value: float | int | None) -> str:
    """Four significant digits; an em dash where the metric was never recorded."""
    return "—" if value is None else f"{value:.4g}"


#: (column header, RunSummary attribute), in table order.
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("steps", "num_steps"),
    ("median step s", "median_time_step_s"),
    ("p95 step s", "p95_time_step_s"),
    ("tokens/s", "median_tokens_per_s"),
    ("peak GPU GB", "peak_gpu_mem_gb"),
    ("peak RSS GB", "peak_host_rss_gb"),
    ("final loss", "final_loss"),
    ("final reward", "final_reward"),
)


def render_table(report: Report) -> Table:
    """One row per run; ``state`` when any run has one, ``shared node`` when any shared."""
    with_state = any(row.state for row in report.rows)
    with_shared = any(row.shared_node for row in report.rows)
    table = Table(title=report.title, title_justify="left")
    table.add_column("run")
    for key in report.swept_keys:
        table.add_column(key.rsplit(".", 1)[-1], overflow="fold")
    if with_state:
        table.add_column("state")
    for header, _ in SUMMARY_COLUMNS:
        table.add_column(header, justify="right")
    if with_shared:
        table.add_column("shared node")
    for row in report.rows:
        swept = [row.swept_values.get(key, "") for key in report.swept_keys]
        numbers = [format_number(getattr(row.summary, attr)) for _, attr in SUMMARY_COLUMNS]
        cells = [row.name, *swept, *([row.state] if with_state else []), *numbers]
        table.add_row(*cells, *(["yes" if row.shared_node else ""] if with_shared else []))
    return table


def report_json(report: Report) -> str:
    """The report as JSON for scripts: every row's values, state, summary and notes."""
    import json

    rows = [
        {
            "name": row.name,
            "run_dir": str(row.run_dir),
            "swept_values": row.swept_values,
            "state": row.state,
            "shared_node": row.shared_node,
            "summary": attrs.asdict(row.summary),
            "notes": list(row.notes),
        }  # fmt: skip
        for row in report.rows
    ]
    return json.dumps({"title": report.title, "swept_keys": list(report.swept_keys),
                       "rows": rows, "notes": list(report.notes)}, indent=2)  # fmt: skip
