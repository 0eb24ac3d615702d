"""A run's checkpoints: where they live and which are complete, for the driver that saves
and resumes and for ``hpcrl resume`` that checks there is one to resume from.

Checkpoints live in ``<checkpoint_dir>/step_<NNNNNN>``; the policy writes each one atomically
(a ``.partial`` folder renamed when complete), so the latest complete one is the highest
step folder whose name has no suffix.
"""

from __future__ import annotations

import re
from pathlib import Path

_STEP_DIR_RE = re.compile(r"^step_(\d+)$")


def checkpoint_folder(checkpoint_dir: str | None, run_dir: str | Path) -> Path:
    """Where a run's checkpoints live: ``checkpointing.checkpoint_dir``, else
    ``<run_dir>/checkpoints`` (the driver saves there; ``hpcrl resume`` looks there)."""
    return Path(checkpoint_dir) if checkpoint_dir else Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def complete_checkpoints(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    found = complete_checkpoints(checkpoint_dir)
    return found[-1][1] if found else None
