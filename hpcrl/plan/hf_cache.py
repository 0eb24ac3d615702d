"""Is the model in the Hugging Face cache the job reads, when the job may not download it?

With ``HF_HUB_OFFLINE=1`` in the job's environment, a hub name that is not in its cache fails
minutes later, inside the job, after the queue and Ray. This looks at the cache as the job
will see it, on this machine's filesystem (the cache is shared storage, or this machine for
local profiles), by the hub cache's layout alone: ``<hub>/models--<org>--<name>/snapshots/
<revision>/``. Nothing is imported (no huggingface_hub, no transformers).

Where the job's cache is: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``, each from the job's environment as the script sets it (the
profile's env), else from the submitting shell (a local job and sbatch's default export
inherit it). In a container the path is mapped back through the profile's mounts; a path
only the image has cannot be checked here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe
from hpcrl.run.jobspec import JobSpec

#: ``org/name`` or ``name``, as the hub spells repository ids.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
#: hpcrl's own tiny models, built in the job from a config (no hub).
BUILT_IN_PREFIX = "tiny:"


def model_names(recipe: Recipe) -> list[tuple[str, str]]:
    """(key path, name) of every model or tokenizer the job loads by name."""
    names = [("policy.model_name", recipe.policy.model_name)]
    if recipe.policy.tokenizer.name:
        names.append(("policy.tokenizer.name", recipe.policy.tokenizer.name))
    return names


def _job_env(spec: JobSpec, environ: Mapping[str, str], name: str) -> str | None:
    planned = dict(spec.env)
    return planned[name] if name in planned else environ.get(name)


def job_hub_cache(spec: JobSpec, environ: Mapping[str, str]) -> str:
    """The hub cache folder as the job sees it."""
    explicit = _job_env(spec, environ, "HF_HUB_CACHE")
    if explicit:
        return explicit
    hf_home = _job_env(spec, environ, "HF_HOME")
    if hf_home:
        return os.path.join(hf_home, "hub")
    home = environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".cache", "huggingface", "hub")


def on_this_machine(spec: JobSpec, job_path: str) -> Path | None:
    """``job_path`` on this machine's filesystem: as is without a container, through the
    mount that holds it in one (None: only the image has it)."""
    if spec.container is None:
        return Path(job_path)
    best: tuple[str, str] | None = None
    for mount in spec.container.mounts:
        source, _, rest = mount.partition(":")
        target = rest.split(":", 1)[0] if rest else source
        inside = job_path == target or job_path.startswith(target.rstrip("/") + "/")
        if inside and (best is None or len(target) > len(best[1])):
            best = (source, target)
    if best is None:
        return None
    return Path(best[0] + job_path[len(best[1]) :])


def is_cached(hub: Path, name: str) -> bool:
    snapshots = hub / f"models--{name.replace('/', '--')}" / "snapshots"
    try:
        return any(snapshots.iterdir())
    except OSError:
        return False


def check_models_cached(recipe: Recipe, spec: JobSpec, environ: Mapping[str, str]) -> list[Problem]:
    """An error per hub name missing from an existing cache of an offline job; a warning when
    the cache folder itself is not on this machine (nothing to look in)."""
    offline = (_job_env(spec, environ, "HF_HUB_OFFLINE") or "").strip().lower() in TRUE_WORDS
    if not offline:
        return []
    job_hub = job_hub_cache(spec, environ)
    hub = on_this_machine(spec, job_hub)
    if hub is None:
        return []
    problems = []
    for path, name in model_names(recipe):
        if name.startswith(BUILT_IN_PREFIX) or not HUB_ID.fullmatch(name) or Path(name).exists():
            continue
        if is_cached(hub, name):
            continue
        seen = f"{job_hub} (here: {hub})" if str(hub) != job_hub else job_hub
        fix = (
            f"download it where the job can read it (HF_HUB_CACHE={hub} hf download {name}), "
            'give a local path instead, or set HF_HUB_OFFLINE: "0" in the profile\'s env'
        )
        if hub.is_dir():
            problems.append(Problem(
                path=path, value=name, fix=fix,
                message=f"not in the job's Hugging Face cache {seen}, and the job runs with "
                "HF_HUB_OFFLINE=1: loading it would fail inside the job",
            ))  # fmt: skip
        else:
            problems.append(Problem(
                path=path, value=name, severity="warning", fix=fix,
                message=f"the job runs with HF_HUB_OFFLINE=1 and its Hugging Face cache {seen} "
                "does not exist on this machine, so nothing there holds it",
            ))  # fmt: skip
    return problems
