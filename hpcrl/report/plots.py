"""PNG plots of a report: step time over steps, and (sweeps) metrics vs each swept value.

matplotlib is imported inside the functions, with the Agg backend: the report must work on a
login node without a display, and importing hpcrl must not pay for matplotlib.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from hpcrl.files import write_file
from hpcrl.report.metrics import finite_number
from hpcrl.report.summary import Report

FIGURE_SIZE_IN = (8.0, 5.0)
FIGURE_DPI = 100  # 800 x 500 pixels

#: (title, RunSummary attribute) of the panels in the "vs swept value" figure.
SWEEP_PANELS: tuple[tuple[str, str], ...] = (
    ("median step time (s)", "median_time_step_s"),
    ("peak GPU memory (GB)", "peak_gpu_mem_gb"),
    ("peak host RSS (GB)", "peak_host_rss_gb"),
    ("final loss", "final_loss"),
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    return pyplot


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
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    for row in report.rows:
        pairs = [
            (record["step"], finite_number(record.get("time_step_s")))
            for record in row.records
            if finite_number(record.get("time_step_s")) is not None
        ]
        if pairs:
            steps, times = zip(*pairs, strict=True)
            label = (
                ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in row.swept_values.items())
                or row.name
            )
            axes.plot(steps, times, marker="o", markersize=3, label=label)
    axes.set_xlabel("step")
    axes.set_ylabel("step time (s)")
    axes.set_title(f"step time — {report.title}")
    if axes.has_data():
        axes.legend(fontsize="small")
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)
    return path


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def plot_vs_swept_value(report: Report, key: str, path: Path) -> Path:
    """One panel per summary metric; x is the swept value (categorical when not numeric)."""
    pyplot = _pyplot()
    figure, panels = pyplot.subplots(2, 2, figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    labels = [row.swept_values.get(key, "") for row in report.rows]
    numeric = [_as_number(label) for label in labels]
    xs = numeric if all(x is not None for x in numeric) else list(range(len(labels)))
    for panel, (title, attribute) in zip(panels.flat, SWEEP_PANELS, strict=True):
        points = [
            (x, getattr(row.summary, attribute))
            for x, row in zip(xs, report.rows, strict=True)
            if getattr(row.summary, attribute) is not None
        ]
        if points:
            panel.plot(*zip(*sorted(points), strict=True), marker="o")
        else:
            panel.text(
                0.5, 0.5, "not recorded", ha="center", va="center", transform=panel.transAxes
            )
        panel.set_title(title, fontsize="small")
        if xs is not numeric:
            panel.set_xticks(xs, labels, fontsize="x-small")
    figure.suptitle(f"{report.title}: metrics vs {key}", fontsize="small")
    figure.supxlabel(key, fontsize="small")
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)
    return path
