"""``hpcrl report RUN_OR_SWEEP [...]``: a table per run or sweep point, and PNG plots; several
folders (runs of separate submits, reruns, other sweeps) compared in one table and overlaid
curves (``hpcrl.report.comparison``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    report = subparsers.add_parser(
        "report",
        help="table and plots of a run's or a sweep's metrics; several runs compared",
        description="Summarise metrics.jsonl of a run (or of every sweep point) and plot it; "
        "with several folders, every run of them in one table and overlaid curves.",
    )
    report.add_argument(
        "runs", nargs="+", metavar="RUN_OR_SWEEP", help="run or sweep folders (several: compared)"
    )
    report.add_argument(
        "--out", metavar="DIR",
        help="where to save plots (default: <folder>/report; several: ./hpcrl-compare-<hash>)",
    )  # fmt: skip
    report.add_argument(
        "--json", action="store_true", help="print the rows as JSON for scripts (no plots)"
    )
    report.set_defaults(func=run_report)


def row_loggers(run_dir: Path) -> list[str]:
    from hpcrl.run.logger_destinations import logger_lines
    from hpcrl.submit.status_view import resolved_recipe

    return logger_lines(run_dir, resolved_recipe(run_dir))


def run_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hpcrl.cli.prepare import folder_path
    from hpcrl.cli.status import export_lines
    from hpcrl.cli.terminal import PIPED_WIDTH
    from hpcrl.report.comparison import build_comparison, default_out_dir
    from hpcrl.report.plots import save_plots
    from hpcrl.report.summary import build_report, render_table, report_json

    console = Console(highlight=False, width=None if sys.stdout.isatty() else PIPED_WIDTH)
    paths = [folder_path(run) for run in args.runs]
    # a ReportError ends as one line (main)
    report = build_report(paths[0]) if len(paths) == 1 else build_comparison(paths)
    if args.json:
        print(report_json(report))
        return 0
    console.print(render_table(report))
    for row in report.rows:
        for note in row.notes:
            console.print(f"{row.name}: {note}", markup=False, highlight=False, soft_wrap=True)
    for note in report.notes:
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    for row in report.rows:  # where the run's loggers write (W&B run page, TensorBoard folder)
        for line in row_loggers(row.run_dir):
            console.print(f"{row.name}: {line}", markup=False, highlight=False, soft_wrap=True)
    for row in report.rows:  # its Hugging Face folders (hpcrl export, save_consolidated)
        for line in export_lines(row.run_dir):
            console.print(f"{row.name}: Hugging Face folder of {line}", markup=False,
                          highlight=False, soft_wrap=True)  # fmt: skip
    if not any(row.records for row in report.rows):
        console.print("No metrics recorded yet (metrics.jsonl is empty or missing); no plots.")
        return 0
    if args.out:
        out_dir = folder_path(args.out)
    else:
        out_dir = paths[0] / "report" if len(paths) == 1 else default_out_dir(paths)
    try:
        paths = save_plots(report, out_dir)
    except OSError as error:  # a run folder one may read but not write, say
        from hpcrl.cli.failures import describe_os_error

        console.print(f"no plots: {describe_os_error(error)}; or choose a folder with --out DIR",
                      markup=False, soft_wrap=True)  # fmt: skip
        return 1
    for path in paths:
        console.print(f"plot: {path}", soft_wrap=True)
    return 0
