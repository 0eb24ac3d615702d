"""``<run_dir>/jobspec.json``: the plan as the job reads it, written and read in one place.

The login node writes it (``write_jobspec``, with the run folder); the job reads it back
(``read_jobspec``) through the one strict converter into the same typed ``JobSpec``. So
the job side never reads plan values out of dicts and never re-decides them. The file
records the hpcrl version that planned it: a missing or unreadable file, one written by
another hpcrl, or one that does not structure into this hpcrl's ``JobSpec`` raises one
``JobSpecError`` that names the file and the fix.

A run folder with no plan at all is refused (``JobSpecMissing``), never planned here nor
filled in with defaults: the job side does not import the planner. Whoever runs the driver
by hand writes the plan first (``hpcrl render``; tests and benchmarks plan through the real
planner on their side).

Part of the run-folder contract (``hpcrl.run``): the planner writes through it, the job side
reads through it and never imports ``hpcrl.plan`` (tests/test_stage_boundaries.py).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hpcrl
from hpcrl.run.jobspec import JobSpec

JOBSPEC_FILE = "jobspec.json"


class JobSpecError(RuntimeError):
    """The run folder's jobspec.json cannot be used; ``str(error)`` names the file and the fix."""


class JobSpecMissing(JobSpecError):
    """The run folder has no jobspec.json."""


def jobspec_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / JOBSPEC_FILE


def jobspec_as_dict(spec: JobSpec) -> dict[str, Any]:
    """The plan as plain JSON values (lists for tuples), as the file and the manifest hold it."""
    from hpcrl.config.converter import unstructure

    return unstructure(spec)


def write_jobspec(spec: JobSpec) -> Path:
    """Write ``<spec.run_dir>/jobspec.json`` through ``hpcrl.run.atomic_files.write_file``: atomic (a
    node never reads half a file), modes from the umask, no secrets."""
    from hpcrl.run.atomic_files import write_file  # login side only: the job never writes a plan

    record = {"hpcrl_version": hpcrl.__version__, "jobspec": jobspec_as_dict(spec)}
    return write_file(
        jobspec_path(spec.run_dir), json.dumps(record, indent=2, sort_keys=True) + "\n"
    )


def read_jobspec(run_dir: str | os.PathLike[str]) -> JobSpec:
    """The typed ``JobSpec`` of a run folder; ``JobSpecError`` when it cannot be used."""
    path = jobspec_path(run_dir)
    if not path.is_file():
        raise JobSpecMissing(
            f"{path} does not exist, so this job has no plan: the run folder was not written "
            "by `hpcrl render`/`hpcrl submit`, or the file was removed. "
            f"Fix: {_resubmit_fix(None)}"
        )
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise JobSpecError(
            f"{path} cannot be read as JSON ({error}). Fix: {_resubmit_fix(None)}"
        ) from None
    return _structure_record(path, record)


def _structure_record(path: Path, record: Any) -> JobSpec:
    from hpcrl.config.converter import try_structure

    fields = record.get("jobspec") if isinstance(record, Mapping) else None
    version = record.get("hpcrl_version") if isinstance(record, Mapping) else None
    fix = _resubmit_fix(fields)
    if version != hpcrl.__version__:
        written_by = f"hpcrl {version}" if isinstance(version, str) else "an unknown hpcrl"
        raise JobSpecError(
            f"{path} was written by {written_by}, but this job runs hpcrl {hpcrl.__version__} "
            f"(from {Path(hpcrl.__file__).parent}); a plan is only read by the hpcrl that "
            f"made it. Fix: {fix}; with code: bundle in the cluster profile the job always "
            "runs the hpcrl that planned it"
        )
    if not isinstance(fields, Mapping):
        raise JobSpecError(f"{path} holds no 'jobspec' mapping. Fix: {fix}")
    spec, issues = try_structure(fields, JobSpec)
    if spec is None:
        problems = "; ".join(f"{issue.problem.path}: {issue.problem.message}" for issue in issues)
        raise JobSpecError(
            f"{path} does not match the JobSpec of this hpcrl {hpcrl.__version__} ({problems}). "
            f"Fix: {fix}"
        )
    return spec


def _resubmit_fix(fields: Any) -> str:
    """Plan, render and submit again with the hpcrl the job runs; the exact command when the
    file still names how it was rendered."""
    argv = fields.get("written_by") if isinstance(fields, Mapping) else None
    if isinstance(argv, list) and len(argv) > 2 and all(isinstance(a, str) for a in argv):
        verb = "submit" if argv[1] == "render" else argv[1]
        command = shlex.join(["hpcrl", verb, *argv[2:]])
        return f"submit it again with this hpcrl ({command}), which writes a new run folder"
    return "submit the recipe again with this hpcrl (hpcrl submit RECIPE --cluster PROFILE)"
