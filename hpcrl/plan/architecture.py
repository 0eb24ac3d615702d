"""Can hpcrl build the recipe's model? Read from the model's ``config.json`` on this machine
when it is here: a local folder (through the container mounts), or a snapshot in the Hugging
Face cache the job reads (``hpcrl.plan.hf_cache``); else from hpcrl's table of the models
NeMo RL's configs name (``hpcrl.config.hf_model_table``: a hub name on a fresh login node).
An architecture the recipe's backend cannot build is an error naming ``policy.model_name``
(``hpcrl.config.architectures``); for a name in neither place ``validate`` says that the job
checks it as it starts (``hpcrl.core.driver``), with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcrl.config.architectures import (
    TRANSFORMERS_5_MODEL_TYPES,
    architecture_problem,
    builders,
    config_checked,
    read_hf_config,
)
from hpcrl.config.errors import Problem
from hpcrl.config.hf_model_table import known_hf_config
from hpcrl.config.recipe import Recipe
from hpcrl.plan.hf_cache import BUILT_IN_PREFIX, HUB_ID, job_hub_cache, on_this_machine
from hpcrl.run.jobspec import JobSpec


def model_config_here(
    recipe: Recipe, spec: JobSpec, environ: Mapping[str, str]
) -> dict[str, Any] | None:
    """The model's config.json as the job will read it, when this machine can see it."""
    name = recipe.policy.model_name
    local = on_this_machine(spec, name) if name.startswith("/") else Path(name)
    if local is not None and local.is_dir():
        return read_hf_config(local)
    if not HUB_ID.fullmatch(name):
        return None
    hub = on_this_machine(spec, job_hub_cache(spec, environ))
    if hub is None:
        return None
    snapshots = hub / f"models--{name.replace('/', '--')}" / "snapshots"
    try:
        folders = sorted(snapshots.iterdir())
    except OSError:
        return None
    return next((c for c in map(read_hf_config, folders) if c is not None), None)


def model_config_known(
    recipe: Recipe, spec: JobSpec, environ: Mapping[str, str]
) -> tuple[dict[str, Any] | None, str]:
    """(the model's config.json fields, where they come from): the file when this machine
    can read it (it wins: a local copy may differ from the hub's), else hpcrl's table."""
    config = model_config_here(recipe, spec, environ)
    if config is not None:
        return config, "config.json"
    return known_hf_config(recipe.policy.model_name), "hpcrl's table of NeMo RL's models"


def _checked(recipe: Recipe) -> bool:
    return bool(builders(recipe)) and not recipe.policy.model_name.startswith(BUILT_IN_PREFIX)


def check_model_architecture(
    recipe: Recipe, spec: JobSpec, environ: Mapping[str, str]
) -> list[Problem]:
    if not config_checked(recipe) or recipe.policy.model_name.startswith(BUILT_IN_PREFIX):
        return []
    config, _ = model_config_known(recipe, spec, environ)
    problem = None if config is None else architecture_problem(recipe, config)
    return [] if problem is None else [problem]


def architecture_note(recipe: Recipe, spec: JobSpec, environ: Mapping[str, str]) -> str | None:
    """What ``validate`` says about the model's architecture (None: nothing to say)."""
    if not _checked(recipe):
        return None
    config, source = model_config_known(recipe, spec, environ)
    if config is not None:
        model_type = config.get("model_type")
        note = f"architecture: {model_type!r} ({source}), built by " + ", ".join(
            builder for builder, _, _ in builders(recipe)
        )
        if recipe.backend == "automodel" and model_type in TRANSFORMERS_5_MODEL_TYPES:
            note += (
                " with transformers 5's classes: the job's Python needs transformers >= 5 "
                "(NeMo RL's containers have it; the job stops at start without it)"
            )
        return note
    return (
        f"architecture: the config.json of {recipe.policy.model_name} is not readable here "
        "(no local folder, not in the job's Hugging Face cache) and hpcrl's table of NeMo RL's "
        "models does not list it, so the job checks the architecture as it starts"
    )
