"""``hpcrl validate``, ``hpcrl render`` and ``hpcrl show``: everything before submission.

The stages are imported inside each command so that ``hpcrl --help`` stays light.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from hpcrl.config import ClusterProfile, LoadedRecipe
    from hpcrl.config.errors import Problem
    from hpcrl.run.jobspec import JobSpec


def register(subparsers: Any) -> None:
    validate = subparsers.add_parser(
        "validate",
        help="check a recipe against a cluster profile; submit nothing",
        description="Load the recipe and profile, plan the job and report every problem.",
    )
    add_recipe_arguments(validate)
    validate.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="list the NeMo RL keys hpcrl accepts but does not use, with why",
    )
    validate.set_defaults(func=run_validate)

    render = subparsers.add_parser(
        "render",
        help="write the run folder (job.sbatch, resolved recipe, plan, manifest)",
        description="Plan the job and write its run folder; submits nothing.",
    )
    add_recipe_arguments(render)
    render.add_argument(
        "-o", "--out", metavar="DIR", help="run folder (default: runs/<recipe>-<profile>-<hash>)"
    )
    render.set_defaults(func=run_render)

    show = subparsers.add_parser("show", help="print the job script that render would write")
    add_recipe_arguments(show)
    show.set_defaults(func=run_show)


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """RECIPE, ``--cluster`` and trailing ``key=value`` overrides (shared with ``submit``)."""
    parser.add_argument(
        "recipe", metavar="RECIPE", help="recipe file, or the name of a shipped recipe"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="recipe overrides, e.g. policy.train_global_batch_size=64",
    )
    parser.add_argument(
        "-c",
        "--cluster",
        metavar="PROFILE",
        help="cluster profile name or file (e.g. eos, local); default: $HPCRL_CLUSTER, else "
        "'cluster:' in ~/.config/hpcrl/config.yaml",
    )
    parser.set_defaults(needs_cluster=True)


def folder_path(text: str) -> Path:
    """A folder argument as an absolute, normalised path (``../../x`` resolves here)."""
    return Path(os.path.abspath(os.path.expanduser(text)))


class Prepared(NamedTuple):
    """A loaded recipe and profile and the job planned from them (a NamedTuple: no attrs
    import at startup, so ``hpcrl --help`` stays light)."""

    loaded: LoadedRecipe
    profile: ClusterProfile
    spec: JobSpec
    warnings: tuple[Problem, ...]  # from loading (the plan's own are in spec.checks)
    provenance: dict[str, str]  # for the manifest (hpcrl.render.run_folder.build_manifest)


def prepare(
    recipe: str,
    cluster: str,
    overrides: list[str],
    out: str | None = None,
    runs_dir: Path | None = None,
    for_submission: bool = False,
    recipe_source: str | None = None,
    written_by: tuple[str, ...] | None = None,
    provenance: dict[str, str] | None = None,
    writes: bool = True,
) -> Prepared:
    """Load both inputs (reporting both one's problems together), then plan, then look at what
    the job will find (``hpcrl.plan.environment``: the same check for every command); raise
    ConfigError.

    ``for_submission``: placeholders of an example profile are errors (``hpcrl submit``).
    ``recipe_source``: the recipe as the run should name it (job name, default folder,
    manifest) when ``recipe`` is another file holding it (``hpcrl rerun``: a run's resolved
    recipe); ``written_by``: the command for the script (default ``hpcrl render ...``);
    ``provenance``: more manifest entries (``hpcrl rerun``'s). ``writes=False`` (validate):
    what only the written files hold is not gathered (the code's git commit)."""
    from hpcrl.config import ConfigError, load_profile_with_warnings, load_recipe
    from hpcrl.config.errors import raise_if_errors
    from hpcrl.plan.planner import plan, render_argv
    from hpcrl.plan.submit_host import bundles_dir_for, describe_submit_host
    from hpcrl.render.run_dir_name import default_run_dir

    problems: list[Problem] = []
    loaded = profile = None
    try:
        loaded = load_recipe(recipe, overrides)
    except ConfigError as error:
        problems += error.problems
    try:
        profile, profile_warnings = load_profile_with_warnings(cluster)
    except ConfigError as error:
        problems += error.problems
    if loaded is None or profile is None:
        raise ConfigError(problems)
    warnings = tuple(loaded.warnings) + tuple(profile_warnings)
    if out is not None:
        run_dir = folder_path(out)
    else:  # under the runs folder given, else the user's (hpcrl.cli.user_config)
        base = runs_dir if runs_dir is not None else _user_runs_dir()
        run_dir = default_run_dir(recipe_source or recipe, loaded.resolved_dict, profile, base)
    # Code bundles are kept beside the run folders and shared by every run of the same code.
    host = describe_submit_host(profile, bundles_dir_for(run_dir.parent), git_commit=writes)
    spec = plan(
        loaded.recipe,
        profile,
        run_dir=str(run_dir),
        overrides=overrides,
        recipe_source=recipe_source or recipe,
        profile_source=cluster,
        host=host,
        for_submission=for_submission,
        # -o is part of the command that reproduces the script: the folder is in it
        written_by=written_by
        or render_argv(recipe, cluster, overrides, None if out is None else str(run_dir)),
    )
    from hpcrl.plan.environment import environment_problems

    found = environment_problems(loaded.recipe, spec)
    raise_if_errors([*warnings, *found])
    warnings += tuple(found)
    return Prepared(
        loaded=loaded, profile=profile, spec=spec, warnings=warnings,
        provenance={"profile_source": _as_source(cluster), **(provenance or {})},
    )  # fmt: skip


def _user_runs_dir() -> Path:
    from hpcrl.cli.user_config import default_runs_dir

    return default_runs_dir()


def _as_source(name_or_path: str) -> str:
    """A --cluster argument as a later command can use it from any folder: a file's absolute
    path, else the name as given (found on the search path)."""
    path = Path(name_or_path).expanduser()
    is_path = "/" in name_or_path or os.sep in name_or_path
    return str(path.absolute()) if is_path and path.is_file() else name_or_path


def run_validate(args: argparse.Namespace) -> int:
    prepared = prepare(args.recipe, args.cluster, args.overrides, writes=False)
    from hpcrl.cli.terminal import output_width

    print("\n".join(plan_lines(prepared.spec, output_width())), flush=True)
    from hpcrl.plan.architecture import architecture_note

    note = architecture_note(prepared.loaded.recipe, prepared.spec, os.environ)
    if note:
        print(f"  {note}", flush=True)
    print_warnings(prepared, None)
    lines = unused_keys_lines(prepared.loaded.unused_nemo_rl_keys, args.verbose)
    if lines:
        print("\n".join(lines))
    print(f"OK: {args.recipe} plans on {prepared.profile.name}; nothing was written.")
    return 0


def unused_keys_lines(unused: Any, verbose: bool) -> list[str]:
    """One summary line for the NeMo RL keys hpcrl takes out unused (``hpcrl.config.
    nemo_rl_filter``); with ``verbose`` each key, its value and why."""
    if not unused:
        return []
    at_default = [key for key in unused if key.at_default]
    inert = [key for key in unused if not key.at_default]
    parts = []
    if at_default:
        parts.append(f"{len(at_default)} NeMo RL keys at their defaults are not used by hpcrl")
    if inert:
        parts.append(f"{len(inert)} more cannot change results")
    lines = ["; ".join(parts) + ("" if verbose else " (--verbose lists them)")]
    if verbose:
        from hpcrl.config.errors import show_value

        lines += [
            f"  {key.path} = {show_value(key.value)}: {key.why}"
            for key in sorted(unused, key=lambda key: key.path)
        ]
    return lines


def run_render(args: argparse.Namespace) -> int:
    prepared = prepare(args.recipe, args.cluster, args.overrides, out=args.out)
    from hpcrl.render.run_folder import write_run_folder
    from hpcrl.run.folder_lock import run_folder_lock

    with run_folder_lock(Path(prepared.spec.run_dir), command="hpcrl render"):
        run = write_run_folder(
            prepared.spec,
            prepared.loaded.resolved_dict,
            recipe_path=prepared.loaded.source_path,
            load_warnings=[warning.format() for warning in prepared.warnings],
            provenance=prepared.provenance,
        )
    print_warnings(prepared, None)
    # Plain print, not rich: five lines do not justify rich's import time on every render.
    lines = [f"Wrote {run.path}/"]
    lines += [
        f"  {path.name}" for path in (run.script, run.resolved_recipe, run.jobspec, run.manifest)
    ]
    if prepared.spec.code.bundle is not None:
        lines.append(f"  code -> {prepared.spec.code.bundle.path}")
    lines.append(f"Submit with: {submit_command(prepared.spec)}")
    print("\n".join(lines))
    return 0


def run_show(args: argparse.Namespace) -> int:
    prepared = prepare(args.recipe, args.cluster, args.overrides)
    from hpcrl.render.script import render_sbatch

    text = render_sbatch(prepared.spec)
    from hpcrl.run.atomic_files import refuse_secrets

    refuse_secrets(Path("<the script hpcrl show prints>"), text)
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.syntax import Syntax

        Console().print(Syntax(text, "bash", theme="ansi_dark", word_wrap=True))
    else:
        sys.stdout.write(text)
    print_warnings(prepared, None)
    return 0


def submit_command(spec: JobSpec) -> str:
    from hpcrl.submit.hints import command

    return command("submit", *spec.written_by[2:])


def plan_lines(spec: JobSpec, width: int | None) -> list[str]:
    """What ``hpcrl validate`` shows of a plan: one ``label  value`` line per fact (values
    wrapped at spaces, paths never broken) and each passed check; the warned ones are
    printed once, with their fixes, after it (``print_warnings``)."""
    import shlex

    from hpcrl.submit.labelled_lines import wrap_field

    unit = "GPUs" if spec.device == "gpu" else "CPU worker slots"
    if spec.generation is None:
        nodes = f"{spec.num_nodes} × {spec.slots_per_node} {unit} = {spec.world_size} ranks"
    else:
        nodes = f"{spec.num_nodes} × {spec.slots_per_node} {unit}; {spec.world_size} training ranks"
    fields = [("scheduler", spec.scheduler), ("nodes", nodes)]
    if spec.generation is not None:
        fields.append(("node split", spec.generation.describe(unit)))
    fields.append(("layout", f"{spec.layout.backend}: {spec.layout.describe()}"))
    if spec.megatron_checkpoint_dir is not None:
        fields.append((
            "megatron ckpt dir",
            f"{spec.megatron_checkpoint_dir} (from {spec.megatron_checkpoint_dir_source})",
        ))  # fmt: skip
    fields.append(("python", f"{shlex.join(spec.code.python)} ({spec.code.python_origin})"))
    if spec.container is not None:
        fields += [
            ("container", spec.container.image),
            ("mounts", "\n".join(spec.container.mounts)),
        ]
    fields.append(("run folder", spec.run_dir))
    fields += [(f"check {check.name}", check.format()) for check in spec.checks
               if check.status == "passed"]  # fmt: skip
    label_width = max(len(label) for label, _ in fields)
    lines = [f"{spec.job_name} on {spec.profile_name}"]
    for label, value in fields:
        lines += ["  " + line for line in wrap_field(label, value, _less(width, 2), label_width)]
    return lines


def _less(width: int | None, columns: int) -> int | None:
    return None if width is None else width - columns


def print_warnings(prepared: Prepared, console: Any) -> None:
    """Loading and plan warnings, with their fixes, on stderr."""
    print_plan_warnings(prepared.spec, prepared.warnings)


def print_plan_warnings(spec: JobSpec, load_warnings: tuple[Problem, ...] = ()) -> None:
    """``load_warnings`` and the plan's own warnings, with their fixes, on stderr."""
    from hpcrl.config.errors import Problem, print_problems

    plan_warnings = [
        Problem(
            path=check.path or check.name, message=check.message, fix=check.fix, severity="warning"
        )
        for check in spec.warnings
    ]
    warnings = [*load_warnings, *plan_warnings]
    if warnings:
        print_problems(warnings)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
