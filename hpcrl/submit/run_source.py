"""What a run folder says it was made from, for ``hpcrl rerun``: its resolved recipe, the
recipe as the user named it, and the cluster profile as ``--cluster`` named it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from hpcrl.run.job_record import LIST_RUNS_FIX, RunFolderError, read_json_file


@attrs.frozen(kw_only=True)
class RunSource:
    resolved_recipe: Path  # <run>/recipe.resolved.yaml: what the run ran
    recipe_source: str  # as the user named it (shipped name or path): the new run's name
    profile_source: str  # the --cluster argument (name or path)
    recipe_git_sha: str | None = None  # the commit of the recipe's repository at its render


def read_run_source(run_dir: Path) -> RunSource:
    """The run folder's sources; RunFolderError (why, and the fix) when it has none."""
    from hpcrl.render.run_folder import MANIFEST_NAME, RESOLVED_RECIPE_NAME

    resolved = run_dir / RESOLVED_RECIPE_NAME
    if not run_dir.is_dir() or not resolved.is_file():
        what = "no such run folder" if not run_dir.exists() else f"no {RESOLVED_RECIPE_NAME}"
        raise RunFolderError(f"{run_dir}: {what}", fix=LIST_RUNS_FIX, short="not a run")
    manifest = read_json_file(run_dir / MANIFEST_NAME, _damaged, "render the run again")
    recipe_source = manifest.get("recipe_source") if isinstance(manifest, dict) else None
    profile = _profile_source(manifest) if isinstance(manifest, dict) else None
    if not isinstance(recipe_source, str) or not isinstance(profile, str):
        raise _damaged(
            f"{run_dir / MANIFEST_NAME}: names no recipe_source or profile",
            "restore the manifest, or submit the recipe again with hpcrl submit",
        )
    sha = manifest.get("recipe_git_sha")
    return RunSource(
        resolved_recipe=resolved, recipe_source=recipe_source, profile_source=profile,
        recipe_git_sha=sha if isinstance(sha, str) and sha else None,
    )  # fmt: skip


def _profile_source(manifest: dict[str, Any]) -> Any:
    """The --cluster argument: recorded since hpcrl 0.1 wrote ``profile_source``; before,
    the one in the command that wrote the script, else the profile's name."""
    if "profile_source" in manifest:
        return manifest["profile_source"]
    plan = manifest.get("plan")
    argv = plan.get("written_by") or plan.get("render_argv") if isinstance(plan, dict) else None
    if isinstance(argv, list) and "--cluster" in argv[:-1]:
        return argv[argv.index("--cluster") + 1]
    return manifest.get("profile")


def _damaged(message: str, fix: str) -> RunFolderError:
    return RunFolderError(message, fix, short="bad manifest")
