"""NeMo RL's example configs as users bring them (the snapshots in ../shared/nemo-rl, which CI
has beside the checkout), read through hpcrl's own loader: defaults merged, interpolation
resolved, nothing validated. For tests that take a case from NeMo RL's recipes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.require import unavailable

REPO_ROOT = Path(__file__).resolve().parents[2]
RELEASES = ("v0.5.0", "v0.7.0", "main-7ea279a")


def snapshot_dir(release: str) -> Path:
    """``../shared/nemo-rl/<release>`` beside the checkout (or beside its folder, for a
    worktree one level down)."""
    for base in (REPO_ROOT.parent, REPO_ROOT.parent.parent):
        folder = base / "shared" / "nemo-rl" / release
        if folder.is_dir():
            return folder
    unavailable("deps", f"NeMo RL's config snapshot {release} is not in ../shared/nemo-rl")


def nemo_rl_config(release: str, relative: str) -> dict[str, Any]:
    """The resolved dict of ``examples/configs/<relative>`` of that release."""
    from hpcrl.config.loader import load_merged
    from hpcrl.config.recipe import Recipe

    path = snapshot_dir(release) / "examples" / "configs" / relative
    merged = load_merged(path, (), Recipe)
    assert merged.resolved is not None, [str(p) for p in merged.problems]
    return merged.resolved
