"""Per-step metrics as JSON lines (``<run_dir>/metrics.jsonl``) and memory peaks.

One object per step, written and flushed as soon as the step ends so nothing is lost when
a job dies. ``hpcrl report`` reads these files.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BYTES_PER_GB = 2**30


class MetricsWriter:
    """Appends one JSON object per step; a resumed run appends to the same file, after
    ``drop_steps_from`` removed what it is about to run again."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def drop_steps_from(self, first_step: int) -> int:
        """Remove the records of steps ``>= first_step`` (an earlier attempt ran them after
        the checkpoint this run resumes from, and they run again: none is written twice), and
        any line that is not a record (one cut short when a job died). Returns how many."""
        from hpcrl.run.atomic_files import write_file

        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return 0
        steps = [(line, _step_of(line)) for line in lines]
        kept = [line for line, step in steps if step is not None and step < first_step]
        if len(kept) < len(lines):
            write_file(self.path, "".join(line + "\n" for line in kept))
        return len(lines) - len(kept)

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps({key: _plain(value) for key, value in record.items()}, sort_keys=False)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _plain(value: Any) -> Any:
    """JSON-safe: floats stay floats, NaN/inf become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _plain(value.item())
    return value


class HostMemoryTracker:
    """Peak resident memory of this process plus its child processes, sampled per step.

    The kernel's high-water mark (VmHWM) covers this process between samples; children are
    counted at their current RSS when sampled.
    """

    def __init__(self) -> None:
        self.peak_bytes = 0

    def sample(self) -> float:
        """Update and return the peak in GB."""
        import psutil

        process = psutil.Process()
        total = max(_self_high_water_bytes(), process.memory_info().rss)
        for child in process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:  # exited between listing and reading
                continue
        self.peak_bytes = max(self.peak_bytes, total)
        return self.peak_bytes / BYTES_PER_GB


def _self_high_water_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def format_progress(step: int, num_steps: int, record: Mapping[str, Any]) -> str:
    """One readable line per step, e.g.
    ``step 3/20  reward 0.41±0.12  loss 0.0123  gen 1.2s  lp 0.3s  train 0.8s  412 tok/s``."""
    parts = [f"step {step}/{num_steps}"]
    if "reward_mean" in record:
        parts.append(f"reward {record['reward_mean']:.3f}±{record['reward_std']:.3f}")
    parts.append(f"loss {record['loss']:.4f}")
    if record.get("kl") is not None:
        parts.append(f"kl {record['kl']:.4f}")
    parts.append(f"gnorm {record['grad_norm']:.3f}")
    for key, label in (
        ("time_generate_s", "gen"),
        ("time_logprobs_s", "lp"),
        ("time_train_s", "train"),
    ):
        if key in record:
            parts.append(f"{label} {record[key]:.1f}s")
    if "generated_tokens_per_s" in record:
        parts.append(f"{record['generated_tokens_per_s']:.0f} gen tok/s")
    parts.append(f"{record['tokens_per_s']:.0f} tok/s")
    for key in ("val_reward_mean", "val_loss"):
        if key in record:
            parts.append(f"{key.removesuffix('_mean')} {record[key]:.4f}")
    return "  ".join(parts)
