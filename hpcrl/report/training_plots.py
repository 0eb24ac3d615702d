"""The training at a glance (``training.png``): reward mean ± std, loss, KL, response length,
the step-time split (generate / log-probs / train, stacked) and tokens/s, over steps.

A run draws one line per panel (the split as stacked areas); a sweep draws one line per
point, its split as stacked bars of each point's median phase times. Panels whose metric no
step recorded say so instead of staying blank.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hpcrl.report.summary import Report, ReportRow
from hpcrl.run.metrics_file import finite_number

FIGURE_SIZE_IN = (13.0, 7.5)
FIGURE_DPI = 100
#: (panel title, record key) of the line panels.
LINE_PANELS = (
    ("loss", "loss"),
    ("KL to the reference", "kl"),
    ("response length (tokens, mean)", "response_length_mean"),
    ("tokens/s", "tokens_per_s"),
)
PHASES = (
    ("generate", "time_generate_s"),
    ("log-probs", "time_logprobs_s"),
    ("train", "time_train_s"),
)


def series(row: ReportRow, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the steps that recorded ``key`` as a number (step 0 excluded)."""
    pairs = [
        (float(record["step"]), float(record[key]))
        for record in row.records
        if _number(record.get("step")) and _number(record.get(key)) and record["step"] > 0
    ]
    return [step for step, _ in pairs], [value for _, value in pairs]


def _number(value: Any) -> bool:
    return finite_number(value) is not None  # NaN/infinity left out, as in the table


def row_label(row: ReportRow) -> str:
    """The point's values (or name; a compared run's name), and why it is marked: failed,
    cancelled, shared a node."""
    from hpcrl.report.axes import point_style

    label = row.label or ", ".join(
        f"{k.rsplit('.', 1)[-1]}={v}" for k, v in row.swept_values.items()
    )
    why = point_style(row.state, row.shared_node, "C0").why
    return (label or row.name) + (f" ({why})" if why else "")


def _linestyle(row: ReportRow) -> str:
    from hpcrl.report.axes import FINE_STATES

    return "-" if row.state.upper() in FINE_STATES else "--"  # a failed point: dashed


def plot_training(report: Report, path: Path) -> Path:
    from hpcrl.report.pyplot_agg import agg_pyplot

    pyplot = agg_pyplot()
    figure, panels = pyplot.subplots(2, 3, figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    _reward_panel(panels[0][0], report)
    for panel, (title, key) in zip(
        [panels[0][1], panels[0][2], panels[1][0], panels[1][2]], LINE_PANELS, strict=True
    ):
        _line_panel(panel, report, title, key)
    if len(report.rows) == 1:
        _stacked_split(panels[1][1], report.rows[0])
    else:
        _split_bars(panels[1][1], report)
    figure.suptitle(f"training — {report.title}", fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=FIGURE_DPI)
    pyplot.close(figure)
    return path


def _reward_panel(panel: Any, report: Report) -> None:
    drew = False
    for row in report.rows:
        steps, means = series(row, "reward_mean")
        if not steps:
            continue
        drew = True
        line = panel.plot(steps, means, marker="o", markersize=3, label=row_label(row),
                          linestyle=_linestyle(row))[0]  # fmt: skip
        std_steps, stds = series(row, "reward_std")
        if std_steps == steps:
            low = [m - s for m, s in zip(means, stds, strict=True)]
            high = [m + s for m, s in zip(means, stds, strict=True)]
            panel.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
    _finish(panel, "reward (mean ± std)", drew, legend=len(report.rows) > 1)


def _line_panel(panel: Any, report: Report, title: str, key: str) -> None:
    drew = False
    for row in report.rows:
        steps, values = series(row, key)
        if steps:
            drew = True
            panel.plot(steps, values, marker="o", markersize=3, label=row_label(row),
                       linestyle=_linestyle(row))  # fmt: skip
    _finish(panel, title, drew, legend=False)


def _stacked_split(panel: Any, row: ReportRow) -> None:
    steps_by_phase = [series(row, key) for _, key in PHASES]
    present = [(name, s) for (name, _), s in zip(PHASES, steps_by_phase, strict=True) if s[0]]
    if present:
        common = sorted(set.intersection(*(set(s[0]) for _, s in present)))
        stacks = [[dict(zip(*s, strict=True))[step] for step in common] for _, s in present]
        panel.stackplot(common, *stacks, labels=[name for name, _ in present], alpha=0.8)
        totals = [sum(values) for values in zip(*stacks, strict=True)]
        panel.set_ylim(0, max(totals, default=1.0) * 1.3)  # room for the legend above
        panel.legend(fontsize="x-small", loc="upper center", ncol=len(present))
    _finish(panel, "step time split (s, stacked)", bool(present), legend=False)


def _split_bars(panel: Any, report: Report) -> None:
    labels = [row_label(row) for row in report.rows]
    bottoms = [0.0] * len(report.rows)
    drew = False
    for name, key in PHASES:
        medians = [
            statistics.median(values) if (values := series(row, key)[1]) else 0.0
            for row in report.rows
        ]
        if any(medians):
            drew = True
            panel.bar(range(len(labels)), medians, bottom=bottoms, label=name)
            bottoms = [b + m for b, m in zip(bottoms, medians, strict=True)]
    if drew:
        panel.set_xticks(range(len(labels)), labels, fontsize="x-small", rotation=20)
        panel.legend(fontsize="x-small")
    panel.set_title("median step time split (s)", fontsize="small")
    if not drew:
        _not_recorded(panel)


def _finish(panel: Any, title: str, drew: bool, legend: bool) -> None:
    from hpcrl.report.axes import integer_ticks

    panel.set_title(title, fontsize="small")
    panel.set_xlabel("step", fontsize="x-small")
    panel.tick_params(labelsize="x-small")
    integer_ticks(panel.xaxis)
    if not drew:
        _not_recorded(panel)
    elif legend:
        panel.legend(fontsize="x-small")


def _not_recorded(panel: Any) -> None:
    panel.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=panel.transAxes)
