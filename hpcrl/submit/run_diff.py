"""``hpcrl diff RUN_A RUN_B``: what differs between two runs' inputs.

Three parts, each from the run folder alone: the manifest's provenance (recipe source,
profile, scheduler, hpcrl version, git SHA), the overrides as typed (only in A, only in B),
and the resolved recipe key by key (``recipe.resolved.yaml`` flattened to dotted paths; a
list is one value). Keys missing on one side show as ``(absent)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from hpcrl.run.job_record import RunFolderError

MANIFEST_KEYS = ("recipe_source", "profile", "scheduler", "hpcrl_version", "recipe_git_sha")
ABSENT = "(absent)"


@attrs.frozen(kw_only=True)
class RunDiff:
    manifest: dict[str, tuple[Any, Any]]
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    recipe: dict[str, tuple[Any, Any]]

    @property
    def same(self) -> bool:
        return not (self.manifest or self.only_in_a or self.only_in_b or self.recipe)


def _read(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import yaml

    recipe_path = Path(run_dir) / "recipe.resolved.yaml"
    if not recipe_path.is_file():
        what = "no such folder" if not Path(run_dir).exists() else "no recipe.resolved.yaml"
        raise RunFolderError(f"{run_dir}: {what}",
                             fix="give two run folders that hpcrl render or submit wrote")  # fmt: skip
    try:
        recipe = yaml.safe_load(recipe_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise RunFolderError(f"{recipe_path}: cannot be read ({error})",
                             fix="restore it, or render the run again") from None  # fmt: skip
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    return (recipe if isinstance(recipe, dict) else {}), (
        manifest if isinstance(manifest, dict) else {}
    )


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``; lists and scalars are leaves."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def diff_runs(run_a: Path, run_b: Path) -> RunDiff:
    recipe_a, manifest_a = _read(run_a)
    recipe_b, manifest_b = _read(run_b)
    flat_a, flat_b = flatten(recipe_a), flatten(recipe_b)
    recipe = {
        key: (flat_a.get(key, ABSENT), flat_b.get(key, ABSENT))
        for key in sorted(flat_a.keys() | flat_b.keys())
        if flat_a.get(key, ABSENT) != flat_b.get(key, ABSENT)
    }
    manifest = {
        key: (manifest_a.get(key), manifest_b.get(key))
        for key in MANIFEST_KEYS
        if manifest_a.get(key) != manifest_b.get(key)
    }
    overrides_a = [str(o) for o in manifest_a.get("overrides", []) or []]
    overrides_b = [str(o) for o in manifest_b.get("overrides", []) or []]
    return RunDiff(
        manifest=manifest,
        only_in_a=tuple(o for o in overrides_a if o not in overrides_b),
        only_in_b=tuple(o for o in overrides_b if o not in overrides_a),
        recipe=recipe,
    )


def _shown(value: Any) -> str:
    if value == ABSENT:
        return ABSENT
    return json.dumps(value) if not isinstance(value, str) else value


def render_diff(diff: RunDiff, name_a: str, name_b: str) -> str:
    """Plain text: a line per difference, ``a → b``."""
    lines = [f"a: {name_a}", f"b: {name_b}"]
    if diff.same:
        return "\n".join([*lines, "same recipe, overrides and provenance"]) + "\n"
    for key, (a, b) in diff.manifest.items():
        lines.append(f"{key}: {a} → {b}")
    if diff.only_in_a or diff.only_in_b:
        lines.append("overrides:")
        lines += [f"  - {o}" for o in diff.only_in_a] + [f"  + {o}" for o in diff.only_in_b]
    if diff.recipe:
        lines.append(f"resolved recipe ({len(diff.recipe)} key(s) differ):")
        lines += [f"  {key}: {_shown(a)} → {_shown(b)}" for key, (a, b) in diff.recipe.items()]
    else:
        lines.append("resolved recipe: the same")
    return "\n".join(lines) + "\n"


def diff_json(diff: RunDiff) -> str:
    return json.dumps({
        "manifest": {key: list(pair) for key, pair in diff.manifest.items()},
        "overrides": {"only_in_a": list(diff.only_in_a), "only_in_b": list(diff.only_in_b)},
        "recipe": {key: list(pair) for key, pair in diff.recipe.items()},
    }, indent=2)  # fmt: skip
