"""What the job will find when it starts, seen from this machine: the one check that
``validate``, ``render``, ``show``, ``submit``, ``sweep`` and ``rerun`` all run after planning,
so a command never checks less than ``validate`` does (``submit`` adds only what is its own:
placeholders of an example profile are errors, ``plan(for_submission=True)``).

- a built-in ``tiny:`` model hpcrl does not have;
- a model whose architecture the recipe's backend cannot build (``hpcrl.plan.architecture``);
- a model an offline job cannot find in its Hugging Face cache (``hpcrl.plan.hf_cache``);
- a package a local job's Python lacks (``hpcrl.plan.job_python``);
- a data file under no container mount: on this machine but out of the job's sight (an
  error), or nowhere here (only the image could hold it: a warning);
- a run folder on a machine-local filesystem (``/tmp``) that Slurm's compute nodes may not see.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe
from hpcrl.config.tiny_models import TINY_MODEL_NAMES
from hpcrl.plan.architecture import check_model_architecture
from hpcrl.plan.hf_cache import BUILT_IN_PREFIX, check_models_cached, model_names, on_this_machine
from hpcrl.plan.job_python import check_job_python
from hpcrl.run.jobspec import JobSpec

#: Folders that are each machine's own on most clusters.
NODE_LOCAL_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")
DATA_KEYS = ("train_path", "val_path")


def environment_problems(
    recipe: Recipe, spec: JobSpec, environ: Mapping[str, str] | None = None
) -> list[Problem]:
    """Every problem the job would meet on this machine's side (see the module docstring)."""
    environ = os.environ if environ is None else environ
    return [
        *check_built_in_models(recipe),
        *check_model_architecture(recipe, spec, environ),
        *check_models_cached(recipe, spec, environ),
        *check_job_python(spec),
        *check_data_in_container(recipe, spec),
        *check_run_dir_shared(spec),
    ]


def check_built_in_models(recipe: Recipe) -> list[Problem]:
    """``tiny:<name>`` must be one of hpcrl's tiny models (built in the job from a spec)."""
    known = [BUILT_IN_PREFIX + name for name in TINY_MODEL_NAMES]
    return [
        Problem(
            path=path,
            value=name,
            message="not one of hpcrl's built-in tiny models: the job would fail to build it",
            fix=f"use one of {', '.join(known)}, or a Hugging Face name or local folder",
        )
        for path, name in model_names(recipe)
        if name.startswith(BUILT_IN_PREFIX) and name not in known
    ]


def check_data_in_container(recipe: Recipe, spec: JobSpec) -> list[Problem]:
    """A data file no container mount shows to the job: an error when it is here (the job
    would not see it), a warning when it is not (only the image could hold it)."""
    if spec.container is None:
        return []
    problems = []
    for key in DATA_KEYS:
        path = getattr(recipe.data, key)
        if path is None or on_this_machine(spec, path) is not None:
            continue
        folder = posixpath.dirname(path)
        if Path(path).exists():
            problems.append(Problem(
                path=f"data.{key}", value=path,
                message="on this machine but under no container mount, so the job inside the "
                "container would not find it",
                fix=f"add {folder}:{folder}:ro to the profile's container.mounts, or move the "
                "file under a mounted folder",
            ))  # fmt: skip
        else:
            problems.append(Problem(
                path=f"data.{key}", value=path, severity="warning",
                message="under no container mount and not on this machine: only the image "
                "could hold it, which hpcrl cannot look into",
                fix="mount the folder that holds it (the profile's container.mounts), or make "
                "sure the image has it",
            ))  # fmt: skip
    return problems


def check_run_dir_shared(spec: JobSpec) -> list[Problem]:
    """A Slurm job's run folder must be seen by every node (they read the plan and write their
    logs there); ``/tmp`` is each machine's own on most clusters."""
    local = next((f for f in NODE_LOCAL_FOLDERS if _is_under(spec.run_dir, f)), None)
    if spec.scheduler != "slurm" or local is None:
        return []
    return [
        Problem(
            path="run_dir",
            severity="warning",  # no value: a sweep's points share the warning
            message=f"the run folder is under {local}, which on most clusters is each "
            "machine's own disk: if so, the compute nodes cannot see it and the job fails as "
            "it starts",
            fix="write runs to a filesystem every node mounts (-o/--out, e.g. under /lustre or "
            "your home), unless this cluster shares it",
        )
    ]


def _is_under(path: str, folder: str) -> bool:
    path = posixpath.normpath(path)
    return path == folder or path.startswith(folder + "/")
