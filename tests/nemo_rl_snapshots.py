"""Where the NeMo RL snapshots are (``shared/nemo-rl/<release>``: NeMo RL's example configs
laid out as in its repository): the first ``shared/nemo-rl`` in a folder above the checkout
(CI: ``../shared/nemo-rl``; a worktree under ``/work/wt/`` finds ``/work/shared``). A test
that needs one and does not find it fails under CI and skips elsewhere (tests/require.py)."""

from __future__ import annotations

from pathlib import Path

from tests.require import unavailable

REPO = Path(__file__).resolve().parents[1]


def snapshot_root() -> Path | None:
    for folder in REPO.parents:
        candidate = folder / "shared" / "nemo-rl"
        if candidate.is_dir():
            return candidate
    return None


def snapshot(release: str) -> Path:
    """The snapshot of ``release``, or the test fails (CI) / skips (elsewhere)."""
    root = snapshot_root()
    folder = root / release if root is not None else None
    if folder is None or not (folder / "examples" / "configs").is_dir():
        unavailable(
            "deps",
            f"no NeMo RL snapshot {release} (shared/nemo-rl/{release}/examples/configs) in a "
            f"folder above {REPO}",
        )
    return folder
