"""The run folder as ``hpcrl render`` leaves it: the script, the resolved recipe, the plan
the job reads (``jobspec.json``, see ``hpcrl.run.jobspec_file``) and a manifest.

Only the manifest records when and where it was written; the script stays deterministic.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

import hpcrl
from hpcrl.config.errors import ConfigError, Problem
from hpcrl.render.bundle_writer import write_bundle
from hpcrl.run.atomic_files import replace_symlink, write_file
from hpcrl.run.folder_lock import holds_submitted_job, unusable_folder
from hpcrl.run.jobspec import JobSpec
from hpcrl.run.jobspec_file import jobspec_as_dict, write_jobspec
from hpcrl.run.ray_token import write_job_token

SCRIPT_NAME = "job.sbatch"
RESOLVED_RECIPE_NAME = "recipe.resolved.yaml"
MANIFEST_NAME = "manifest.json"
CODE_LINK_NAME = "code"  # -> the code bundle the script runs (code: bundle)
GIT_TIMEOUT_S = 2.0


@attrs.frozen
class RunFolder:
    """Where ``write_run_folder`` put each file."""

    path: Path
    script: Path
    resolved_recipe: Path
    jobspec: Path
    manifest: Path


def _make_compile_cache(spec: JobSpec) -> None:
    """Create the compile cache folder where this machine sees it: a container mounts it
    (pyxis needs the host folder). A profile's folder on storage only the nodes see is left
    to the job (torch creates it)."""
    if spec.compile_cache_dir is None:
        return
    try:
        Path(spec.compile_cache_dir).mkdir(parents=True, exist_ok=True)
    except OSError:
        pass


def git_sha(directory: Path | None) -> str | None:
    """HEAD of the git repository holding ``directory``; None when there is none (or no git)."""
    import subprocess  # here: a command that starts no process skips its import (~4 ms)

    if directory is None:
        return None
    try:
        result = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = result.stdout.strip()
    return sha if result.returncode == 0 and len(sha) == 40 else None


def write_run_folder(
    spec: JobSpec,
    resolved_recipe: Mapping[str, Any],
    *,
    recipe_path: Path | None,
    load_warnings: Sequence[str] = (),
    provenance: Mapping[str, str] | None = None,
) -> RunFolder:
    """Write ``job.sbatch`` (executable), ``recipe.resolved.yaml``, ``jobspec.json`` and
    ``manifest.json`` to ``spec.run_dir`` (modes as the umask allows: ``hpcrl.run.atomic_files``), the
    code bundle the script runs unless it exists already, and the job's Ray token
    (``auth/ray_token``, 0600) unless the folder has one.

    The caller holds ``hpcrl.run.folder_lock.run_folder_lock`` of the folder (or of a sweep folder
    above it). Refuses a folder that already holds a submitted job: its script is the record
    of what ran.
    """
    # Jinja costs ~25 ms to import; hpcrl validate imports this module and never renders
    from hpcrl.render.script import render_sbatch

    folder = Path(spec.run_dir)
    _refuse_submitted(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise unusable_folder(folder, error) from None
    write_job_token(spec)  # before anything that could name it; kept when it exists
    if spec.code.bundle is not None:
        bundle = write_bundle(spec.code.bundle)
        replace_symlink(folder / CODE_LINK_NAME, os.path.relpath(bundle, folder))
    script, resolved = folder / SCRIPT_NAME, folder / RESOLVED_RECIPE_NAME
    write_file(script, render_sbatch(spec), executable=True)
    write_file(resolved, _to_yaml(resolved_recipe))
    run = RunFolder(folder, script, resolved, write_jobspec(spec), folder / MANIFEST_NAME)
    manifest = build_manifest(
        spec, recipe_path=recipe_path, load_warnings=load_warnings, provenance=provenance
    )
    write_file(run.manifest, json.dumps(manifest, indent=2) + "\n")
    _make_compile_cache(spec)  # last: a write that fails above (a full disk) leaves none
    return run


def build_manifest(
    spec: JobSpec,
    *,
    recipe_path: Path | None,
    load_warnings: Sequence[str] = (),
    provenance: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``provenance``: where the inputs came from, as the command was given them
    (``profile_source``: the --cluster argument; ``rerun_of``: the run a rerun started from,
    ``recipe_git_sha``: that run's)."""
    return {
        **(provenance or {}),
        "hpcrl_version": hpcrl.__version__,
        "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "recipe_source": spec.recipe_source,
        "recipe_path": str(recipe_path) if recipe_path else None,
        # a rerun keeps its source run's (its recipe file is a copy outside any repository)
        "recipe_git_sha": (provenance or {}).get("recipe_git_sha")
        or git_sha(recipe_path.parent if recipe_path else None),
        "profile": spec.profile_name,
        "scheduler": spec.scheduler,
        "overrides": list(spec.overrides),
        "job_name": spec.job_name,
        "checks": {
            "passed": [check.format() for check in spec.checks if check.status == "passed"],
            "warned": [check.format() for check in spec.checks if check.status == "warned"],
        },
        "load_warnings": [str(warning) for warning in load_warnings],
        "plan": jobspec_as_dict(spec),  # a copy for readers; the job reads jobspec.json
    }


def _refuse_submitted(folder: Path) -> None:
    if holds_submitted_job(folder):
        raise ConfigError(
            [
                Problem(
                    path="run_dir",
                    value=str(folder),
                    message="this run folder already holds a submitted job; rendering would overwrite its record",
                    fix="render into a new folder with -o/--out, or change the recipe/overrides",
                )
            ]
        )


def _plain(value: Any) -> Any:
    """JSON fallback for the resolved recipe: sets become sorted lists, anything else text."""
    return sorted(value, key=str) if isinstance(value, set | frozenset) else str(value)


def _to_yaml(data: Mapping[str, Any]) -> str:
    import yaml  # PyYAML comes with omegaconf; imported here so `hpcrl --help` stays light

    plain = json.loads(json.dumps(data, default=_plain))
    return yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, allow_unicode=True)
