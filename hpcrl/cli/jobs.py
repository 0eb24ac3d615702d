"""``hpcrl submit``, ``sweep``, ``status``, ``logs`` and ``cancel``.

status/logs/cancel work from a run folder alone (``job.json``, submitit's files, sacct).
Stages are imported inside the commands so that ``hpcrl --help`` stays light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.cli.prepare import add_recipe_arguments, folder_path
from hpcrl.cli.status import print_sweep_summary
from hpcrl.cli.terminal import PIPED_WIDTH

if TYPE_CHECKING:
    from rich.console import Console

    from hpcrl.cli.prepare import Prepared
    from hpcrl.config.recipe import Recipe
    from hpcrl.run.job_record import JobRecord
    from hpcrl.submit.sweep_launch import PlannedSweep


def register(subparsers: Any) -> None:
    submit = subparsers.add_parser(
        "submit", help="render the run folder and submit the job",
        description="Plan, write the run folder (as `hpcrl render`) and submit it through submitit.",
    )  # fmt: skip
    add_recipe_arguments(submit)
    submit.add_argument(
        "-o", "--out", metavar="DIR", help="run folder (default: runs/<recipe>-<profile>-<hash>)"
    )
    submit.add_argument(
        "--wait", action="store_true", help="follow the job and exit with its exit code"
    )
    submit.set_defaults(func=run_submit)

    sweep = subparsers.add_parser(
        "sweep", help="submit one job array over a grid of overrides",
        description="Check every point, then submit them as one Slurm job array.",
    )  # fmt: skip
    add_recipe_arguments(sweep)
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="an axis of the grid (repeat: axes multiply)")  # fmt: skip
    sweep.add_argument("--zip", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="keys that vary together (equal lengths), one more axis")  # fmt: skip
    sweep.add_argument(
        "-o", "--out", metavar="DIR", help="sweep folder (default: runs/<recipe>-sweep-<hash>)"
    )
    sweep.add_argument("--wait", action="store_true", help="wait until every point has ended")
    sweep.add_argument(
        "--no-submit", action="store_true",
        help="write the sweep folder (sweep.json, each point's run folder) and stop",
    )  # fmt: skip
    sweep.set_defaults(func=run_sweep)

    from hpcrl.cli.status import register as register_status

    register_status(subparsers)

    _register_logs_and_cancel(subparsers)


def _register_logs_and_cancel(subparsers: Any) -> None:
    logs = subparsers.add_parser(
        "logs", help="print (or follow) a run's logs (a sweep folder: every point's)",
        description="Every log line once, prefixed [node<k> <file>] ([point-<i> ...] in sweeps).",
    )  # fmt: skip
    logs.add_argument("run", metavar="RUN", help="run folder, sweep point or sweep folder")
    logs.add_argument("--node", type=int, metavar="N", help="only node N (0 = head)")
    logs.add_argument("--point", type=int, metavar="N", help="a sweep folder: only point N")
    logs.add_argument(
        "--driver", action="store_true", help="only the training driver's log (node 0)"
    )
    logs.add_argument(
        "--attempt", type=int, metavar="K", help="only attempt K (1 = first run; requeues add more)"
    )
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the job ends"
    )
    logs.add_argument(
        "--raw", action="store_true",
        help="every line: also a cancelled job's shutdown output (signal stack dumps, ...)",
    )  # fmt: skip
    logs.set_defaults(func=run_logs)

    cancel = subparsers.add_parser(
        "cancel", help="cancel runs' jobs (a sweep folder: the whole array)"
    )
    cancel.add_argument(
        "runs", nargs="+", metavar="RUN", help="runs, sweep points or sweep folders"
    )
    cancel.set_defaults(func=run_cancel)


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else PIPED_WIDTH)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def max_steps(recipe: Recipe) -> int | None:
    section = recipe.grpo if recipe.grpo is not None else recipe.sft
    return section.max_num_steps if section is not None else None


# --------------------------------------------------------------------------- submit
def prepare_fresh(prepare_into: Callable[[str | None], Prepared], out: str | None) -> Prepared:
    """Plan the run (``prepare_into(out)``); without -o, a folder already holding a job gets a
    numbered sibling (one whose submission failed is used again)."""
    from hpcrl.run.folder_lock import next_free_folder

    prepared = prepare_into(out)
    if out is not None:
        return prepared
    run_dir, numbered = next_free_folder(Path(prepared.spec.run_dir))
    return prepare_into(str(run_dir)) if numbered else prepared


def run_submit(args: argparse.Namespace) -> int:
    from hpcrl.cli.prepare import prepare

    def prepare_into(out: str | None) -> Prepared:
        return prepare(args.recipe, args.cluster, args.overrides, out=out, for_submission=True)

    return submit_prepared(prepare_fresh(prepare_into, args.out), args.wait, "hpcrl submit")


def submit_prepared(prepared: Prepared, wait: bool, command: str) -> int:
    """Write the planned run folder, submit it, say how to follow it; with ``wait``, follow it
    and return its exit code."""
    from hpcrl.cli.prepare import print_warnings
    from hpcrl.render.run_folder import write_run_folder
    from hpcrl.run.folder_lock import run_folder_lock
    from hpcrl.submit.submission import SubmissionRefused, submit_job

    console = _console()
    print_warnings(prepared, console)
    with run_folder_lock(Path(prepared.spec.run_dir), command=command):
        run = write_run_folder(
            prepared.spec, prepared.loaded.resolved_dict, recipe_path=prepared.loaded.source_path,
            load_warnings=[warning.format() for warning in prepared.warnings],
            provenance=prepared.provenance,
        )  # fmt: skip
        try:
            record = submit_job(prepared.spec, run.script)
        except SubmissionRefused as error:
            print(refusal_text(error), file=sys.stderr)
            return 1
    print_submitted(console, record, run.path)
    if not wait:
        return 0
    from hpcrl.submit.waiting import wait_for_job

    outcome = wait_for_job(run.path, record, console, max_steps(prepared.loaded.recipe))
    return outcome.exit_code


def refusal_text(error: Exception) -> str:
    """``not submitted: <sbatch's answer>`` and the fix (secrets a scheduler echoed hidden)."""
    from hpcrl.config.secrets import redact

    fix = getattr(error, "fix", "")
    return redact(f"not submitted: {error}" + (f"\nfix: {fix}" if fix else ""))


def print_submitted(console: Console, record: JobRecord, run_dir: Path) -> None:
    from hpcrl.submit.hints import command, quoted_path

    where = f"{record.num_tasks} node(s) on {record.cluster}"
    console.print(f"Submitted job [bold]{record.job_id}[/] ({_escape(record.job_name)}, {where})")
    _print_hints(console, [
        ("run folder", quoted_path(run_dir)),
        ("follow", command("logs", run_dir, "-f")),
        ("status", command("status", run_dir)),
        ("cancel", command("cancel", run_dir)),
    ])  # fmt: skip


def _print_hints(console: Console, hints: list[tuple[str, str]]) -> None:
    """``  follow      hpcrl logs runs/x -f``: each a line that runs as printed (no markup)."""
    for label, text in hints:
        console.print(f"  {label:<11} {text}", markup=False, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------- sweep
def run_sweep(args: argparse.Namespace) -> int:
    from hpcrl.cli.user_config import default_runs_dir
    from hpcrl.submit.sweep import build_points
    from hpcrl.submit.sweep_launch import default_sweep_dir, plan_sweep, sweep_argv

    points = build_points(args.grid, args.zip)  # a SweepError ends as one line (main)
    sweep_dir = folder_path(args.out) if args.out else default_sweep_dir(
        args.recipe, args.cluster, args.overrides, points, default_runs_dir()
    )  # fmt: skip
    if args.no_submit and args.wait:
        print("hpcrl sweep: --wait needs a submitted sweep; drop --no-submit", file=sys.stderr)
        return 2
    written_by = sweep_argv(
        args.recipe, args.cluster, args.overrides, args.grid, args.zip,
        sweep_dir if args.out else None,
    )  # fmt: skip
    planned = plan_sweep(
        args.recipe, args.cluster, args.overrides, points, sweep_dir,
        for_submission=not args.no_submit, written_by=written_by,
    )  # fmt: skip
    from hpcrl.run.folder_lock import run_folder_lock

    _print_sweep_warnings(planned)
    if args.no_submit:
        with run_folder_lock(sweep_dir, command="hpcrl sweep --no-submit"):
            return _write_unsubmitted(planned)
    if planned.array_spec is None:  # a local profile: the points run one by one
        return _run_local_sweep(planned, args.wait)
    from hpcrl.submit.submission import SubmissionRefused
    from hpcrl.submit.sweep_launch import write_and_submit_sweep

    try:
        with run_folder_lock(sweep_dir, command="hpcrl sweep"):
            record, job_records = write_and_submit_sweep(planned)
    except SubmissionRefused as error:
        print(refusal_text(error), file=sys.stderr)
        return 1
    from hpcrl.submit.hints import command, quoted_path

    console = _console()
    console.print(
        f"Submitted sweep {_escape(record.name)}: job array [bold]{record.array_job_id}[/] with "
        f"{len(points)} points (at most {planned.array_spec.array_parallelism} at once)"
    )
    for point, job in zip(record.points, job_records, strict=True):
        console.print(
            f"  {job.job_id:>10}  {quoted_path(sweep_dir / point.run_dir_name)}  "
            f"{point.describe()}", markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
    _print_hints(console, [("status", command("status", sweep_dir)),
                           ("report", command("report", sweep_dir))])  # fmt: skip
    if not args.wait:
        return 0
    return _wait_sweep(sweep_dir, job_records, console)


def _print_sweep_warnings(planned: PlannedSweep) -> None:
    """What submitting each point alone would warn about, each text once (on stderr)."""
    from hpcrl.config.errors import print_problems
    from hpcrl.submit.sweep_launch import sweep_warnings

    warnings = sweep_warnings(planned)
    if warnings:
        print_problems(warnings)


def _write_unsubmitted(planned: PlannedSweep) -> int:
    """``--no-submit``: the folders only, each point's path and its values."""
    from hpcrl.submit.hints import command, quoted_path
    from hpcrl.submit.sweep_launch import write_sweep_folders

    write_sweep_folders(planned)
    console = _console()
    console.print(
        f"Wrote sweep {planned.record.name} with {len(planned.points)} points (not submitted)",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
    for point in planned.record.points:
        console.print(f"  {quoted_path(planned.sweep_dir / point.run_dir_name)}  "
                      f"{point.describe()}", markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    _print_hints(console, [("report", command("report", planned.sweep_dir))])
    return 0


def _run_local_sweep(planned: PlannedSweep, wait: bool) -> int:
    """Local profile: the points run one after another, this command starting each in turn."""
    from hpcrl.submit.sweep_launch import run_local_sweep
    from hpcrl.submit.waiting import DETACHED_EXIT_CODE, wait_for_job

    if not wait:
        print(
            f"hpcrl sweep: on the local profile {planned.points[0].spec.profile_name!r} the "
            f"points run one after another (they would share this machine's "
            f"{'GPUs' if planned.points[0].spec.device == 'gpu' else 'cores'}), started by this "
            "command as each one ends: add --wait (or write the points with --no-submit)",
            file=sys.stderr,
        )
        return 2
    from hpcrl.submit.hints import command, quoted_path

    console = _console()
    console.print(
        f"Sweep {planned.record.name}: {len(planned.points)} points on "
        f"{planned.points[0].spec.profile_name}, one after another",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip

    def announce(point: Any, job: JobRecord) -> None:
        folder = quoted_path(planned.sweep_dir / point.point.run_dir_name)
        console.print(f"  {job.job_id:>10}  {folder}  {point.point.describe()}",
                      markup=False, highlight=False, soft_wrap=True)  # fmt: skip

    def follow(run_dir: Path, job: JobRecord) -> int:
        steps = max_steps(planned.points[job.array_index or 0].loaded.recipe)
        return wait_for_job(run_dir, job, console, steps).exit_code

    from hpcrl.run.folder_lock import run_folder_lock

    with run_folder_lock(planned.sweep_dir, command="hpcrl sweep (local points in turn)"):
        exit_code = run_local_sweep(planned, wait=follow, announce=announce)
    if exit_code != DETACHED_EXIT_CODE:
        print_sweep_summary(planned.sweep_dir)
    _print_hints(console, [("status", command("status", planned.sweep_dir)),
                           ("report", command("report", planned.sweep_dir))])  # fmt: skip
    return exit_code


def _wait_sweep(sweep_dir: Path, job_records: list[JobRecord], console: Console) -> int:
    from hpcrl.run.sweep_record import read_sweep_record
    from hpcrl.submit.waiting import wait_for_jobs

    points = read_sweep_record(sweep_dir).point_run_dirs(sweep_dir)
    outcomes = wait_for_jobs(list(zip(points, job_records, strict=True)), console)
    if not any(outcome.detail == "detached" for outcome in outcomes):
        print_sweep_summary(sweep_dir)
    return next((outcome.exit_code for outcome in outcomes if outcome.exit_code != 0), 0)


# --------------------------------------------------------------------------- logs / cancel
def run_logs(args: argparse.Namespace) -> int:
    from hpcrl.config.errors import UserError
    from hpcrl.submit.log_view import LogSelection, check_attempt
    from hpcrl.submit.run_logs import show_logs

    if args.driver and args.node not in (None, 0):
        raise UserError(f"--driver with --node {args.node}: the driver runs on node 0",
                        fix="drop --node, or --driver")  # fmt: skip
    selection = LogSelection(
        node=args.node, attempt=args.attempt, driver_only=args.driver, raw=args.raw
    )
    check_attempt([], selection)  # a number no job can have: said before the folder is read
    # `hpcrl logs RUN | head` (a closed pipe) ends quietly: hpcrl.cli.failures
    return show_logs(folder_path(args.run), selection, args.point, follow_job=args.follow)


def run_cancel(args: argparse.Namespace) -> int:
    """Every folder given; one that cannot be cancelled is said and the rest still are."""
    from hpcrl.cli.failures import report_failure
    from hpcrl.config.errors import UserError
    from hpcrl.submit.cancel import cancel_run

    console = _console()
    paths = [folder_path(run) for run in args.runs]
    if len(paths) == 1:
        return cancel_run(paths[0], console)
    codes = []
    for path in paths:
        try:
            codes.append(cancel_run(path, console))
        except UserError as error:
            codes.append(report_failure("cancel", error))
    return next((code for code in codes if code != 0), 0)
