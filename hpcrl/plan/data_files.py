"""The recipe's data files must exist before the job waits in a queue.

``data.train_path`` and ``data.val_path`` are absolute after loading (a relative path in a
recipe resolves against the recipe's folder, so a shipped recipe finds its shipped data; an
override resolves against the working directory). They are checked on this machine: a
cluster's shared filesystems look the same from the login node. In a container a path
under a mount's container side is checked at its host side; a path under no mount can only
come from the image, which only the job sees.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from hpcrl.plan.findings import Findings
from hpcrl.plan.mounts import Mount, is_under

DATA_KEYS = ("train_path", "val_path")


def check_data_files(
    recipe: Recipe, profile: ClusterProfile, mounts: list[Mount], findings: Findings
) -> None:
    found = []
    for key in DATA_KEYS:
        path = getattr(recipe.data, key)
        if path is None:
            continue
        host_path = path if profile.container is None else _host_side(path, mounts)
        if host_path is None:
            continue  # under no mount: only the image can hold it, which only the job sees
        if not Path(host_path).is_file():
            findings.error(f"data.{key}", _why_unusable(Path(host_path), path), value=path,
                           fix=f"point data.{key} at a JSONL file (relative paths in a recipe "
                           "are relative to the recipe's folder; in an override, to the "
                           "current folder)")  # fmt: skip
        else:
            found.append(f"data.{key}")
    if found:
        findings.passed("data_files", f"{' and '.join(found)} found")


def _host_side(path: str, mounts: list[Mount]) -> str | None:
    """Where a container path lies on the host, through the innermost mount covering it."""
    covering = [mount for mount in mounts if is_under(path, mount.container_path)]
    if not covering:
        return None
    mount = max(covering, key=lambda m: len(posixpath.normpath(m.container_path)))
    relative = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(mount.container_path))
    return posixpath.normpath(posixpath.join(mount.host_path, relative))


def _why_unusable(host_path: Path, path: str) -> str:
    seen_as = "" if str(host_path) == path else f" (on this machine: {host_path})"
    if host_path.is_dir():
        return f"a folder, not a data file{seen_as}"
    if host_path.exists():
        return f"not a regular file{seen_as}"
    return f"no such file{seen_as}"
