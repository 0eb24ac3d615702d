"""PNG plots of a report: step time over steps, and (sweeps) metrics vs each swept value.

matplotlib is imported inside the functions, with the Agg backend (``hpcrl.report.pyplot_agg``):
the report must work on a login node without a display, and importing hpcrl must not pay for
matplotlib.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from hpcrl.report.axes import (
    PointStyle,
    apply_integer_ticks,
    integer_ticks,
    point_style,
    swept_axis,
    value_axis,
)
from hpcrl.report.pyplot_agg import agg_pyplot
from hpcrl.report.summary import Report, ReportRow
from hpcrl.run.atomic_files import write_file
from hpcrl.run.metrics_file import finite_number

FIGURE_SIZE_IN = (8.0, 5.0)
FIGURE_DPI = 100  # 800 x 500 pixels

#: (title, RunSummary attribute) of the panels in the "vs swept value" figure.
SWEEP_PANELS: tuple[tuple[str, str], ...] = (
    ("final reward", "final_reward"),
    ("final loss", "final_loss"),
    ("median step time (s)", "median_time_step_s"),
    ("median tokens/s", "median_tokens_per_s"),
    ("peak GPU memory (GB)", "peak_gpu_mem_gb"),
    ("peak host RSS (GB)", "peak_host_rss_gb"),
)


def save_plots(report: Report, out_dir: Path) -> list[Path]:
    """Write the report's plots into ``out_dir``; return their paths."""
    from hpcrl.report.training_plots import plot_training

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        plot_training(report, out_dir / "training.png"),
        plot_step_times(report, out_dir / "step_time.png"),
    ]
    for key in report.swept_keys:
        paths.append(plot_vs_swept_value(report, key, out_dir / f"vs_{key.rsplit('.', 1)[-1]}.png"))
    return paths


def _save(figure: Any, path: Path) -> None:
    """PNG bytes through hpcrl's one write primitive (atomic, modes from the umask)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=FIGURE_DPI)
    write_file(path, buffer.getvalue())


def plot_step_times(report: Report, path: Path) -> Path:
    pyplot = agg_pyplot()
    figure, axes = pyplot.subplots(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    for row in report.rows:
        pairs = [
            (record["step"], finite_number(record.get("time_step_s")))
            for record in row.records
            if finite_number(record.get("time_step_s")) is not None
        ]
        if pairs:
            steps, times = zip(*pairs, strict=True)
            axes.plot(steps, times, marker="o", markersize=3, label=_label(row),
                      linestyle="--" if _marked(row) else "-")  # fmt: skip
    axes.set_xlabel("step")
    axes.set_ylabel("step time (s)")
    integer_ticks(axes.xaxis)
    every_time = [y for line in axes.get_lines() for y in line.get_ydata()]
    y_axis = value_axis(every_time)
    if y_axis.limits is not None:
        axes.set_ylim(*y_axis.limits)
    note = f" ({y_axis.note})" if y_axis.note else ""
    axes.set_title(f"step time — {report.title}{note}")
    if axes.has_data():
        axes.legend(fontsize="small")
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)
    return path


def _label(row: ReportRow) -> str:
    from hpcrl.report.training_plots import row_label

    return row_label(row)


def _marked(row: ReportRow) -> bool:
    return bool(point_style(row.state, row.shared_node, "C0").why)


def marks_legend(styles: list[PointStyle]) -> str:
    """What the title says of the marks drawn: `` (red ×: failed, cancelled; hollow: shared a
    node)``, each part only when a point has that mark; '' when none has."""
    crossed = sorted({style.why for style in styles if style.why and style.marker == "X"})
    hollow = any(style.why and style.facecolor == "none" for style in styles)
    parts = [f"red ×: {', '.join(crossed)}"] if crossed else []
    parts += ["hollow: shared a node"] if hollow else []
    return f" ({'; '.join(parts)})" if parts else ""


def plot_vs_swept_value(report: Report, key: str, path: Path) -> Path:
    """One panel per summary metric against the swept value: a log axis for values spanning
    decades, categories for text; failed points crossed, points that shared a node hollow."""
    pyplot = agg_pyplot()
    figure, panels = pyplot.subplots(2, 3, figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    axis = swept_axis([row.swept_values.get(key, "") for row in report.rows])
    for panel, (title, attribute) in zip(panels.flat, SWEEP_PANELS, strict=True):
        _sweep_panel(panel, report, axis, title, attribute)
    legend = marks_legend([point_style(r.state, r.shared_node, "C0") for r in report.rows])
    figure.suptitle(f"{report.title}: metrics vs {key}{legend}", fontsize="small")
    figure.supxlabel(key + (" (log scale)" if axis.scale == "log" else ""), fontsize="small")
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)
    return path


def _sweep_panel(panel: Any, report: Report, axis: Any, title: str, attribute: str) -> None:
    # by position alone: two points of a two-axis sweep may share both (rows do not order)
    points = sorted(
        (
            (x, value, row)
            for x, row in zip(axis.xs, report.rows, strict=True)
            if (value := getattr(row.summary, attribute)) is not None
        ),
        key=lambda point: point[:2],
    )
    if axis.scale == "log":
        panel.set_xscale("log")
    if axis.scale == "category":
        panel.set_xticks(axis.xs, axis.labels, fontsize="x-small")
    apply_integer_ticks(panel, axis)  # a swept seed or batch size: 1, 2, 3, not 1.5
    if not points:
        panel.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=panel.transAxes)
        panel.set_title(title, fontsize="small")
        return
    panel.plot([x for x, _, _ in points], [v for _, v, _ in points], color="C0", zorder=1)
    for x, value, row in points:
        style = point_style(row.state, row.shared_node, "C0")
        panel.scatter([x], [value], marker=style.marker, facecolors=style.facecolor,
                      edgecolors=style.edgecolor, s=40, zorder=2)  # fmt: skip
    y_axis = value_axis([value for _, value, _ in points])
    if y_axis.limits is not None:
        panel.set_ylim(*y_axis.limits)
    panel.set_title(title + (f" ({y_axis.note})" if y_axis.note else ""), fontsize="small")
    panel.tick_params(labelsize="x-small")
