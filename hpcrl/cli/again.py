"""``hpcrl resume`` and ``hpcrl rerun``: a run again.

``resume RUN``: the same run folder, its next attempt, from its last checkpoint
(``hpcrl.submit.resumption``). ``rerun RUN [KEY=VALUE ...]``: a new run from the run's
resolved recipe (``recipe.resolved.yaml``: what it ran, whatever happened to the recipe file
since), with overrides on top, on the same profile unless ``--cluster`` names another.
Stages are imported inside the commands so that ``hpcrl --help`` stays light.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.cli.prepare import folder_path

if TYPE_CHECKING:
    from hpcrl.cli.prepare import Prepared


def register(subparsers: Any) -> None:
    resume = subparsers.add_parser(
        "resume", help="continue a run in its folder from its last checkpoint (next attempt)",
        description="Submit a run's job again, in the same run folder, as its next attempt: "
        "the driver restores the newest checkpoint; each attempt's logs stay apart.",
    )  # fmt: skip
    resume.add_argument("run", metavar="RUN", help="run folder (a sweep's point-<i> folder)")
    resume.add_argument(
        "--wait", action="store_true", help="follow the job and exit with its exit code"
    )
    resume.set_defaults(func=run_resume)

    rerun = subparsers.add_parser(
        "rerun", help="a new run from a run's resolved recipe (+ overrides)",
        description="Plan and submit a new run from RUN/recipe.resolved.yaml with the overrides "
        "given, on RUN's cluster profile unless --cluster names another.",
    )  # fmt: skip
    rerun.add_argument("run", metavar="RUN", help="run folder (a sweep's point-<i> folder)")
    rerun.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="overrides on top of RUN's recipe"
    )
    rerun.add_argument(
        "-c", "--cluster", metavar="PROFILE", help="cluster profile (default: RUN's profile)"
    )
    rerun.add_argument(
        "-o", "--out", metavar="DIR", help="run folder (default: <RUN>-rerun beside RUN)"
    )
    rerun.add_argument(
        "--wait", action="store_true", help="follow the job and exit with its exit code"
    )
    rerun.set_defaults(func=run_rerun)


def run_resume(args: argparse.Namespace) -> int:
    from hpcrl.cli.jobs import _console, max_steps, print_submitted
    from hpcrl.config import load_recipe
    from hpcrl.render.run_folder import RESOLVED_RECIPE_NAME
    from hpcrl.run.sweep_record import is_sweep_dir
    from hpcrl.submit.hints import shown_path
    from hpcrl.submit.resumption import resume_run

    run_dir = folder_path(args.run)
    _refuse_sweep(run_dir, is_sweep_dir(run_dir), "resume")
    point, record = resume_run(run_dir)
    console = _console()
    console.print(
        f"Resuming {shown_path(run_dir)} from its checkpoint of step {point.checkpoint_step} "
        f"({point.checkpoint}) as attempt {point.attempt_offset + 1}; job "
        f"{point.previous.job_id} had ended {point.previous_status.state}",
        markup=False, soft_wrap=True,
    )  # fmt: skip
    print_submitted(console, record, run_dir)
    if not args.wait:
        return 0
    from hpcrl.submit.waiting import wait_for_job

    recipe = load_recipe(run_dir / RESOLVED_RECIPE_NAME).recipe
    return wait_for_job(run_dir, record, console, max_steps(recipe)).exit_code


def run_rerun(args: argparse.Namespace) -> int:
    from hpcrl.cli.jobs import submit_prepared

    return submit_prepared(prepare_rerun(args), args.wait, "hpcrl rerun")


def prepare_rerun(args: argparse.Namespace) -> Prepared:
    """The new run planned from RUN's resolved recipe and ``args.overrides``: in
    ``<RUN>-rerun`` unless ``-o``, its manifest naming RUN and RUN's recipe commit."""
    from hpcrl.cli.prepare import prepare
    from hpcrl.run.sweep_record import is_sweep_dir
    from hpcrl.submit.run_source import read_run_source

    run_dir = folder_path(args.run)
    _refuse_sweep(run_dir, is_sweep_dir(run_dir), "rerun")
    source = read_run_source(run_dir)
    cluster = args.cluster or source.profile_source
    out, numbered = (folder_path(args.out), False) if args.out else rerun_dir(run_dir)
    written_by = (
        "hpcrl", "rerun", str(run_dir), *args.overrides,
        *(("--cluster", args.cluster) if args.cluster else ()),
        *(("-o", str(out)) if args.out or numbered else ()),
    )  # fmt: skip
    provenance = {"rerun_of": str(run_dir)}
    if source.recipe_git_sha:  # the recipe's commit is the source run's, not this folder's
        provenance["recipe_git_sha"] = source.recipe_git_sha
    return prepare(
        str(source.resolved_recipe), cluster, args.overrides, out=str(out), for_submission=True,
        recipe_source=source.recipe_source, written_by=written_by, provenance=provenance,
    )  # fmt: skip


def rerun_dir(run_dir: Path) -> tuple[Path, bool]:
    """``<run>-rerun`` beside the run (a sweep point's beside the sweep:
    ``<sweep>-point-1-rerun``), ``-rerun-2``, ``-rerun-3``, ... when that one holds a job;
    and whether it was numbered."""
    from hpcrl.run.sweep_record import is_sweep_dir

    if is_sweep_dir(run_dir.parent):
        base = run_dir.parent.parent / f"{run_dir.parent.name}-{run_dir.name}-rerun"
    else:
        base = run_dir.parent / f"{run_dir.name}-rerun"
    from hpcrl.run.folder_lock import next_free_folder

    return next_free_folder(base)


def _refuse_sweep(path: Path, is_sweep: bool, command: str) -> None:
    if is_sweep:
        from hpcrl.run.job_record import RunFolderError
        from hpcrl.run.sweep_record import read_sweep_record

        points = ", ".join(p.run_dir_name for p in read_sweep_record(path).points)
        raise RunFolderError(
            f"{path} is a sweep; hpcrl {command} takes one run",
            fix=f"give one point folder ({points})",
        )
