"""``hpcrl status``: every run as one line that fits the terminal; one run in full.

Stages are imported inside the functions so that ``hpcrl --help`` stays light.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcrl.cli.prepare import folder_path
from hpcrl.cli.terminal import output_width


def register(subparsers: Any) -> None:
    status = subparsers.add_parser(
        "status", help="state of runs (default: every run under the runs folder)",
        description="One line per run, fitted to the terminal (--wide: every column in full); "
        "one run given: every field of it.",
    )  # fmt: skip
    status.add_argument("runs", nargs="*", metavar="RUN", help="run or sweep folders")
    status.add_argument("--runs-dir", metavar="DIR",
                        help="where to look without RUN (default: $HPCRL_RUNS_DIR, else "
                        "'runs_dir:' in ~/.config/hpcrl/config.yaml, else ./runs)")  # fmt: skip
    status.add_argument("--state", action="append", default=[], metavar="STATE[,STATE]",
                        help="only runs in these states (RUNNING, PENDING, FAILED, COMPLETED, "
                        "CANCELLED, NOT_SUBMITTED, ...; any case)")  # fmt: skip
    status.add_argument("--recipe", metavar="TEXT", help="only runs whose recipe contains TEXT")
    status.add_argument("--since", metavar="AGE",
                        help="only runs submitted (or rendered) within AGE: 30m, 2h, 1d, 1w")  # fmt: skip
    status.add_argument("--wide", action="store_true",
                        help="every column in full, however wide the lines get")  # fmt: skip
    status.add_argument("--json", action="store_true", help="a JSON list instead of the table")
    status.set_defaults(func=run_status)


def _status_filter(args: argparse.Namespace) -> Any:
    from hpcrl.config.errors import UsageError, UserError
    from hpcrl.submit.job_status import RUN_STATES
    from hpcrl.submit.status_view import StatusFilter, parse_age

    states = {
        word.strip().upper() for text in args.state for word in text.split(",") if word.strip()
    }
    unknown = sorted(states - RUN_STATES)
    if unknown:
        raise UsageError(
            f"--state {','.join(unknown)}: not a run state",
            fix=f"one or more of {', '.join(sorted(RUN_STATES))} (any case, comma-separated)",
        )
    try:
        max_age_s = parse_age(args.since) if args.since is not None else None
    except ValueError as error:
        raise UserError(f"--since: {error}", fix="e.g. --since 2h") from None
    return StatusFilter(states=frozenset(states), recipe=args.recipe, max_age_s=max_age_s)


def status_lines(runs: Sequence[Any], width: int | None) -> list[str]:
    """The table of ``runs`` as lines of at most ``width`` characters (None: in full), with a
    line naming what was cut or left out."""
    from hpcrl.submit.hints import command
    from hpcrl.submit.status_table import fitting_note, render_table
    from hpcrl.submit.status_view import table_cells, table_columns

    table = render_table(table_columns(runs), [table_cells(run) for run in runs], width)
    return [*table.lines, *fitting_note(table, command("status", "--wide"), width)]


def print_sweep_summary(sweep_dir: Path) -> None:
    """After ``sweep --wait``: every point's state, exit code, values, steps, reward, loss."""
    from hpcrl.submit.status_view import collect_run_dirs, run_statuses

    runs = run_statuses(collect_run_dirs([sweep_dir], sweep_dir.parent))
    print(f"sweep {sweep_dir.name}")
    print("\n".join(status_lines(runs, output_width())), flush=True)


def _listed(args: argparse.Namespace) -> list[Any]:
    from hpcrl.cli.user_config import default_runs_dir
    from hpcrl.submit.status_view import collect_run_dirs

    runs_dir = _given_runs_dir(args.runs_dir) if args.runs_dir else default_runs_dir()
    args.runs_dir = str(runs_dir)
    return collect_run_dirs([folder_path(run) for run in args.runs], runs_dir)


def _given_runs_dir(given: str) -> Path:
    """``--runs-dir`` as given: it must be a folder (the default one may not exist yet)."""
    from hpcrl.config.errors import UsageError

    path = folder_path(given)
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        raise UsageError(
            f"--runs-dir {given}: {what}",
            fix="give the folder that holds your run folders (runs/ where you submitted), or "
            "name runs themselves: hpcrl status RUN ...",
        )
    return path


def run_status(args: argparse.Namespace) -> int:
    import datetime

    from hpcrl.submit.status_view import as_json, run_statuses

    keep = _status_filter(args)
    listed = _listed(args)
    now = datetime.datetime.now(datetime.UTC)
    runs = [run for run in run_statuses(listed) if keep.keeps(run, now)]
    if args.json:
        print(as_json(runs))
        return 0
    if not runs:
        where = "matching the filters" if listed else f"under {args.runs_dir}/"
        print(f"No runs {where} (submit one with: hpcrl submit RECIPE --cluster C)")
        return 0
    width = None if args.wide else output_width()
    if args.runs and len(runs) == 1:
        print("\n".join(_one_run(runs[0], width)))
        return 1 if runs[0].problem else 0
    print("\n".join(status_lines(runs, width)))
    for run in runs:
        if run.problem:
            print(f"{run.name}: {run.problem}")
    return 1 if args.runs and any(run.problem for run in runs) else 0


def _one_run(run: Any, width: int | None) -> list[str]:
    """``hpcrl status RUN``: every field, then where its loggers write and its logs."""
    from hpcrl.run.job_record import submit_fix
    from hpcrl.run.logger_destinations import logger_lines
    from hpcrl.submit.hints import command
    from hpcrl.submit.status_detail import detail_lines
    from hpcrl.submit.status_view import NOT_SUBMITTED, resolved_recipe

    if run.state == NOT_SUBMITTED:
        commands = [("submit", submit_fix(Path(run.path)).removeprefix("submit it with: "))]
    else:
        commands = [("logs", command("logs", Path(run.path)))]
    loggers = logger_lines(Path(run.path), resolved_recipe(Path(run.path)))
    exports = export_lines(Path(run.path))
    extra = [("loggers", "\n".join(loggers)), ("exports", "\n".join(exports))]
    return detail_lines(run, extra, width, commands)


def export_lines(run_dir: Path) -> list[str]:
    """Where the run's Hugging Face folders are (``hpcrl.submit.exports``), one per line."""
    from hpcrl.submit.exports import describe_export, list_exports

    return [describe_export(entry) for entry in list_exports(run_dir)]
