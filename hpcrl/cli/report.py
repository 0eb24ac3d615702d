"""``hpcrl report RUN_OR_SWEEP``: a table per run or sweep point, and PNG plots."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    report = subparsers.add_parser(
        "report",
        help="table and plots of a run's or a sweep's metrics",
        description="Summarise metrics.jsonl of a run (or of every sweep point) and plot it.",
    )
    report.add_argument("run", metavar="RUN_OR_SWEEP", help="run folder or sweep folder")
    report.add_argument(
        "--out", metavar="DIR", help="where to save plots (default: <folder>/report)"
    )
    report.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hpcrl.cli.jobs import PIPED_WIDTH
    from hpcrl.cli.prepare import folder_path
    from hpcrl.report.plots import save_plots
    from hpcrl.report.summary import ReportError, build_report, render_table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else PIPED_WIDTH)
    try:
        report = build_report(folder_path(args.run))
    except ReportError as error:
        console.print(f"[red]hpcrl report:[/] {error}")
        return 2
    console.print(render_table(report))
    if not any(row.records for row in report.rows):
        console.print("No metrics recorded yet (metrics.jsonl is empty or missing); no plots.")
        return 0
    out_dir = folder_path(args.out) if args.out else folder_path(args.run) / "report"
    for path in save_plots(report, out_dir):
        console.print(f"plot: {path}", soft_wrap=True)
    return 0
