"""Plan, write and submit a sweep: every point is checked before anything is submitted.

Layout of ``<runs>/<recipe>-sweep-<hash>/``:
``job.sbatch`` (the array script that runs; its submitit folder is ``submitit/``),
``recipe.resolved.yaml`` and ``manifest.json`` of point 0 (the array's allocation is planned
from it), ``sweep.json`` (points, array job id), and ``point-<i>/`` per point with that
point's resolved recipe, manifest, ``job.json``, logs and metrics. ``point-<i>/job.sbatch``
is the point alone as a single job (what ``hpcrl render`` with its overrides writes); the
array ran ``../job.sbatch``.

``hpcrl sweep --no-submit`` stops after ``write_sweep_folders``: the same folders and
``sweep.json`` (no array job id), for points run by hand, e.g. on a GPU machine without Slurm.
submitit is imported only when submitting, so that path runs where submitit is not installed.

On a local profile (one machine, no Slurm) there is no array: ``run_local_sweep`` submits each
point as its own local job (``point-<i>/job.sbatch``) and starts the next when it has ended,
because points side by side would share the machine's GPUs or cores and spoil each other's
step times and memory peaks. The folder has no top-level ``job.sbatch`` then.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from hpcrl.config import (
    ConfigError,
    LoadedRecipe,
    Problem,
    load_profile_with_warnings,
    load_recipe,
)
from hpcrl.config.errors import raise_if_errors
from hpcrl.config.profile import ClusterProfile
from hpcrl.plan.planner import plan
from hpcrl.plan.submit_host import SubmitHost, bundles_dir_for, describe_submit_host
from hpcrl.render.run_folder import (
    CODE_LINK_NAME,
    MANIFEST_NAME,
    RESOLVED_RECIPE_NAME,
    SCRIPT_NAME,
    write_run_folder,
)
from hpcrl.run.folder_lock import LOCK_NAME
from hpcrl.run.job_record import JobRecord, utc_now_iso
from hpcrl.run.jobspec import AUTH_DIR_NAME, JobSpec
from hpcrl.run.jobspec_file import JOBSPEC_FILE
from hpcrl.run.sweep_record import SweepPoint, SweepRecord, write_sweep_record
from hpcrl.submit.sweep import sweep_hash

POINT_DIR = re.compile(r"point-([0-9]+)")
#: What ``write_run_folder`` leaves in a point folder; the token of a point that was never
#: submitted admits no running job.
RENDERED_FILES = frozenset(
    {SCRIPT_NAME, RESOLVED_RECIPE_NAME, MANIFEST_NAME, CODE_LINK_NAME, JOBSPEC_FILE, LOCK_NAME,
     AUTH_DIR_NAME}
)  # fmt: skip


@attrs.frozen(kw_only=True)
class PlannedPoint:
    point: SweepPoint
    loaded: LoadedRecipe
    spec: JobSpec
    #: what ``hpcrl submit`` of this point alone would warn about: loading (the recipe's and
    #: the profile's), the plan's checks, the job's Hugging Face cache
    warnings: tuple[Problem, ...] = ()


@attrs.frozen(kw_only=True)
class PlannedSweep:
    sweep_dir: Path
    record: SweepRecord
    points: tuple[PlannedPoint, ...]
    array_spec: JobSpec | None  # None on a local profile: its points run one by one

    @property
    def runs_points_one_by_one(self) -> bool:
        return self.array_spec is None


def sweep_name(recipe_source: str, cluster: str, overrides: Sequence[str],
               points: Sequence[SweepPoint]) -> str:  # fmt: skip
    """``<recipe>-sweep-<hash>``: the sweep's job name, and its folder's name unless -o."""
    stem = Path(recipe_source).name.removesuffix(".yaml").removesuffix(".yml")
    return f"{stem}-sweep-{sweep_hash(recipe_source, cluster, overrides, points)}"


def default_sweep_dir(recipe_source: str, cluster: str, overrides: Sequence[str],
                      points: Sequence[SweepPoint], runs_dir: Path) -> Path:  # fmt: skip
    return (runs_dir / sweep_name(recipe_source, cluster, overrides, points)).absolute()


def plan_sweep(
    recipe_source: str,
    cluster: str,
    overrides: Sequence[str],
    points: Sequence[SweepPoint],
    sweep_dir: Path,
    for_submission: bool = False,
    written_by: Sequence[str] | None = None,
) -> PlannedSweep:
    """Load and plan every point; one ConfigError naming each bad point, its values and path.

    ``for_submission``: placeholders of an example profile are errors. ``written_by``: the
    ``hpcrl sweep ...`` command, written into every script of the sweep (default: built from
    the arguments, without -o). The array job is named ``<recipe>-sweep-<hash>`` (its points
    ``...-point-<i>``) wherever the folder is."""
    profile, profile_warnings = load_profile_with_warnings(cluster)
    # Array tasks take neighbouring Ray port bands (hpcrl.config.port_bands), so they may share
    # a node; a port the profile names is the same for every task, so then whole nodes each.
    if profile.ray_ports.named:
        profile = attrs.evolve(profile, slurm=attrs.evolve(profile.slurm, exclusive=True))
    # One submitting side for all points: the same code bundle, beside the sweep folder.
    context = _PlanContext(
        profile=profile,
        profile_warnings=tuple(profile_warnings),
        host=describe_submit_host(profile, bundles_dir_for(sweep_dir.parent)),
        for_submission=for_submission,
        name=sweep_name(recipe_source, cluster, overrides, points),
        written_by=tuple(written_by or _points_argv(recipe_source, cluster, overrides, points)),
    )
    planned, found = [], []
    for point in points:
        try:
            planned.append(
                _plan_point(recipe_source, cluster, overrides, point, context, sweep_dir)
            )
        except ConfigError as error:
            found += [(problem, point) for problem in error.problems]
    if any(problem.is_error for problem, _ in found):
        # a mistake every failing point shares (a misspelled key) is one problem, not one per point
        raise ConfigError(_each_once(found, points))
    _check_distinct_points(planned)
    _check_one_allocation_shape(planned)
    first = planned[0]
    array_spec = None
    if profile.scheduler == "slurm":
        array_spec = plan(
            first.loaded.recipe, profile, run_dir=str(sweep_dir), overrides=first.spec.overrides,
            recipe_source=recipe_source, profile_source=cluster, job_name=context.name,
            array_size=len(planned), host=context.host, for_submission=for_submission,
            written_by=context.written_by,
        )  # fmt: skip
    record = SweepRecord(
        name=sweep_dir.name, recipe_source=recipe_source, cluster=cluster,
        overrides=tuple(overrides), swept_keys=tuple(points[0].values), points=tuple(points),
    )  # fmt: skip
    return PlannedSweep(
        sweep_dir=sweep_dir, record=record, points=tuple(planned), array_spec=array_spec
    )


@attrs.frozen(kw_only=True)
class _PlanContext:
    """What every point of a sweep is planned against."""

    profile: ClusterProfile
    profile_warnings: tuple[Problem, ...]
    host: SubmitHost
    for_submission: bool
    name: str  # <recipe>-sweep-<hash>
    written_by: tuple[str, ...]


def sweep_argv(recipe_source: str, cluster: str, overrides: Sequence[str], grid: Sequence[str],
               zips: Sequence[str], sweep_dir: Path | None = None) -> tuple[str, ...]:  # fmt: skip
    """``hpcrl sweep RECIPE --cluster C OVERRIDES --grid ... --zip ... [-o DIR]``."""
    axes = [*(("--grid", axis) for axis in grid), *(("--zip", axis) for axis in zips)]
    out = ("-o", str(sweep_dir)) if sweep_dir is not None else ()
    flat = [word for axis in axes for word in axis]
    return ("hpcrl", "sweep", recipe_source, "--cluster", cluster, *overrides, *flat, *out)


def _points_argv(recipe_source: str, cluster: str, overrides: Sequence[str],
                 points: Sequence[SweepPoint]) -> tuple[str, ...]:  # fmt: skip
    """Without the command line: one --zip per key over every point's value (the same points)."""
    zips = [f"{key}={','.join(p.values[key] for p in points)}" for key in points[0].values]
    return sweep_argv(recipe_source, cluster, overrides, (), zips)


def _plan_point(recipe_source: str, cluster: str, overrides: Sequence[str], point: SweepPoint,
                context: _PlanContext, sweep_dir: Path) -> PlannedPoint:  # fmt: skip
    point_overrides = [*overrides, *point.overrides]
    loaded = load_recipe(recipe_source, point_overrides)
    spec = plan(
        loaded.recipe, context.profile, run_dir=str(sweep_dir / point.run_dir_name),
        overrides=point_overrides, recipe_source=recipe_source, profile_source=cluster,
        job_name=f"{context.name}-{point.run_dir_name}", host=context.host,
        for_submission=context.for_submission, written_by=context.written_by,
    )  # fmt: skip
    from hpcrl.plan.environment import environment_problems  # what validate/submit check

    found = environment_problems(loaded.recipe, spec)
    raise_if_errors([p for p in found if p.is_error])
    warnings = (*loaded.warnings, *context.profile_warnings, *plan_warnings(spec), *found)
    return PlannedPoint(point=point, loaded=loaded, spec=spec, warnings=warnings)


def plan_warnings(spec: JobSpec) -> list[Problem]:
    """The plan's warned checks as Problems (what ``print_problems`` shows)."""
    return [
        Problem(path=check.path or check.name, message=check.message, fix=check.fix,
                severity="warning")
        for check in spec.warnings
    ]  # fmt: skip


def sweep_warnings(planned: PlannedSweep) -> list[Problem]:
    """Every point's warnings, each text once: one that every point has is shown as is, one
    that only some have names them (``[sweep point 1: grpo.max_num_steps=300]``, or ``[sweep
    points 0, 2]``). The array script's own (planned from point 0) count for every point."""
    points = [point.point for point in planned.points]
    found = [(warning, point.point) for point in planned.points for warning in point.warnings]
    if planned.array_spec is not None:  # the array's own, unless a point has it already
        texts = {warning.format() for warning, _ in found}
        found += [(warning, point) for warning in plan_warnings(planned.array_spec)
                  if warning.format() not in texts for point in points]  # fmt: skip
    return _each_once(found, points)


def _each_once(
    found: Sequence[tuple[Problem, SweepPoint]], points: Sequence[SweepPoint]
) -> list[Problem]:
    """Each problem text once: as is when every point has it, else naming the points that do
    (``[sweep point 1: grpo.seed=2]``, ``[sweep points 0, 2]``)."""
    by_text: dict[str, tuple[Problem, list[SweepPoint]]] = {}
    for problem, point in found:
        entry = by_text.setdefault(problem.format(), (problem, []))
        if point not in entry[1]:
            entry[1].append(point)
    shown = []
    for problem, at in by_text.values():
        if len(at) == len(points):
            shown.append(problem)
        elif len(at) == 1:
            shown.append(_at_point(problem, at[0]))
        else:
            where = ", ".join(str(point.index) for point in at)
            shown.append(attrs.evolve(problem, message=f"[sweep points {where}] {problem.message}"))
    return shown


def _at_point(problem: Problem, point: SweepPoint) -> Problem:
    return attrs.evolve(
        problem, message=f"[sweep point {point.index}: {point.describe()}] {problem.message}"
    )


def _check_distinct_points(planned: Sequence[PlannedPoint]) -> None:
    """No two points may train the same recipe: values that differ only as text
    (``grpo.seed=1,01``, ``lr=1e-3,0.001``) are compared as the typed recipe takes them."""
    first_of: dict[str, PlannedPoint] = {}
    problems = []
    for point in planned:
        resolved = json.dumps(point.loaded.effective_dict(), sort_keys=True, default=repr)
        earlier = first_of.setdefault(resolved, point)
        if earlier is point:
            continue
        one, other = earlier.point, point.point
        differ = [key for key in one.values if one.values[key] != other.values[key]]
        problems.append(Problem(
            path=", ".join(differ or one.values),
            value=[", ".join(p.values[key] for key in differ) for p in (one, other)],
            message=f"sweep points {one.index} ({one.describe()}) and {other.index} "
            f"({other.describe()}) resolve to the same recipe: two runs of one training",
            fix="list each value once ("
            + "; ".join(f"{one.values[key]} and {other.values[key]} are the same {key}"
                        for key in differ)
            + ")",
        ))  # fmt: skip
    raise_if_errors(problems)


def _check_one_allocation_shape(planned: Sequence[PlannedPoint]) -> None:
    """One job array has one allocation shape; a swept key must not change it."""
    shapes = {(p.spec.num_nodes, p.spec.slots_per_node, p.spec.cpus_per_node) for p in planned}
    if len(shapes) > 1:
        by_point = ", ".join(f"point {p.point.index}: {p.spec.num_nodes} nodes" for p in planned)
        raise ConfigError([Problem(
            path="cluster.num_nodes", value=sorted(shapes),
            message=f"sweep points need different allocations ({by_point}); one job array has one",
            fix="sweep keys that keep the node count, or run separate sweeps per node count",
        )])  # fmt: skip


def write_sweep_folders(planned: PlannedSweep) -> Path | None:
    """Write every point's folder, the array script and ``sweep.json``; the array's script
    (None for a local sweep, which has none).

    Point folders an earlier, unsubmitted sweep left in the folder beyond this sweep's points
    are removed (they hold only rendered files); one holding a job or results is refused.
    """
    _remove_stale_points(planned.sweep_dir, len(planned.points))
    provenance = {"profile_source": planned.record.cluster}
    for point in planned.points:
        loaded = point.loaded
        write_run_folder(point.spec, loaded.resolved_dict, recipe_path=loaded.source_path,
                         provenance=provenance)  # fmt: skip
    script = None
    if planned.array_spec is not None:
        first = planned.points[0].loaded
        run = write_run_folder(
            planned.array_spec, first.resolved_dict, recipe_path=first.source_path,
            provenance=provenance,
        )  # fmt: skip
        script = run.script
    # sweep.json before submitting: the points are on record even if submission fails
    write_sweep_record(planned.sweep_dir, planned.record)
    return script


def _remove_stale_points(sweep_dir: Path, num_points: int) -> None:
    stale = sorted(
        path
        for path in (sweep_dir.iterdir() if sweep_dir.is_dir() else ())
        if path.is_dir()
        and (match := POINT_DIR.fullmatch(path.name))
        and int(match[1]) >= num_points
    )
    for path in stale:
        left = {entry.name for entry in path.iterdir()}
        if not left <= RENDERED_FILES:
            raise ConfigError([Problem(
                path="run_dir", value=str(sweep_dir),
                message=f"holds {path.name} of an earlier sweep with more points, and it holds "
                f"more than rendered files ({', '.join(sorted(left - RENDERED_FILES))})",
                fix="sweep into a new folder with -o/--out (or move that folder away)",
            )])  # fmt: skip
    for path in stale:
        shutil.rmtree(path)


def write_and_submit_sweep(planned: PlannedSweep) -> tuple[SweepRecord, list[JobRecord]]:
    """Write every point's folder and the array script, submit one array, write sweep.json."""
    from hpcrl.submit.submission import submit_array

    assert planned.array_spec is not None, "local sweeps go through run_local_sweep"
    script = write_sweep_folders(planned)  # each point's folder holds the plan its job reads
    assert script is not None
    point_dirs = planned.record.point_run_dirs(planned.sweep_dir)
    records = submit_array(planned.array_spec, script, point_dirs)
    record = attrs.evolve(
        planned.record, array_job_id=records[0].array_job_id, submitted_at=utc_now_iso()
    )
    write_sweep_record(planned.sweep_dir, record)
    return record, records


def run_local_sweep(
    planned: PlannedSweep,
    wait: Callable[[Path, JobRecord], int],
    announce: Callable[[PlannedPoint, JobRecord], None],
) -> int:
    """A sweep on a local profile: each point a local job of its own, started when the one
    before it has ended (``wait`` follows a job and returns its exit code). Every point runs,
    also after one fails; returns the first non-zero exit code, else 0. A wait left with
    Ctrl-C (``DETACHED_EXIT_CODE``) starts no further point."""
    from hpcrl.render.run_folder import SCRIPT_NAME
    from hpcrl.submit.submission import submit_job
    from hpcrl.submit.waiting import DETACHED_EXIT_CODE

    assert planned.runs_points_one_by_one, "Slurm sweeps are one job array"
    write_sweep_folders(planned)
    write_sweep_record(planned.sweep_dir, attrs.evolve(planned.record, submitted_at=utc_now_iso()))
    codes = []
    for point in planned.points:
        run_dir = Path(point.spec.run_dir)
        record = submit_job(
            point.spec,
            run_dir / SCRIPT_NAME,
            array_index=point.point.index,
            sweep_dir=str(planned.sweep_dir),
        )
        announce(point, record)
        codes.append(wait(run_dir, record))
        if codes[-1] == DETACHED_EXIT_CODE:
            break
    return next((code for code in codes if code != 0), 0)
