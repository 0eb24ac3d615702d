"""A run's checkpoints: where they live and which are complete, for the driver that saves
and resumes, for ``hpcrl resume`` that checks there is one to resume from, and for
``hpcrl export`` that converts one (and for the Hugging Face folders written beside them).

Checkpoints live in ``<checkpoint_dir>/step_<NNNNNN>``; the policy writes each one atomically
(a ``.partial`` folder renamed when complete), so the latest complete one is the highest
step folder whose name has no suffix.
"""

from __future__ import annotations

import re
from pathlib import Path

_STEP_DIR_RE = re.compile(r"^step_(\d+)$")
#: ``checkpointing.save_consolidated``: the Hugging Face folder inside each checkpoint.
CONSOLIDATED_SUBDIR = "hf"
#: Written last into every Hugging Face folder hpcrl exports: which run, step, checkpoint.
EXPORT_RECORD = "hpcrl_export.json"
#: In the checkpoint folder: each kept step's ``checkpointing.metric_name`` value (the
#: checkpoint store writes it; ``hpcrl export --best`` ranks by it).
METRICS_INDEX = "checkpoint_metrics.json"


def checkpoint_folder(checkpoint_dir: str | None, run_dir: str | Path) -> Path:
    """Where a run's checkpoints live: ``checkpointing.checkpoint_dir``, else
    ``<run_dir>/checkpoints`` (the driver saves there; ``hpcrl resume`` looks there)."""
    return Path(checkpoint_dir) if checkpoint_dir else Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def step_of_checkpoint(folder: str | Path) -> int | None:
    """N of a ``step_N`` folder; None for any other name."""
    match = _STEP_DIR_RE.match(Path(folder).name)
    return int(match.group(1)) if match else None


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
