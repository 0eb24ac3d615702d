"""The default run folder's name: ``<recipe-stem>-<profile>-<fingerprint>``.

Apart from ``hpcrl.render.run_folder`` (which writes the folder) so that ``hpcrl validate``,
which only names the folder, does not import the writing side (the code bundle writer, the
folder lock, the Ray token, ``tempfile``, ``datetime``: ~4 ms of every validate here).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.profile import ClusterProfile


def plan_fingerprint(resolved_recipe: Mapping[str, Any], profile: ClusterProfile) -> str:
    """8 hex digits that change whenever the resolved recipe or the profile changes."""
    text = json.dumps(
        {"recipe": resolved_recipe, "profile": attrs.asdict(profile)}, sort_keys=True, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def default_run_dir(
    recipe_source: str, resolved_recipe: Mapping[str, Any], profile: ClusterProfile, base: Path
) -> Path:
    """``<base>/<recipe-stem>-<profile>-<fingerprint>``: equal inputs land in the same folder."""
    stem = Path(recipe_source).name.removesuffix(".yaml").removesuffix(".yml")
    return (base / f"{stem}-{profile.name}-{plan_fingerprint(resolved_recipe, profile)}").absolute()
