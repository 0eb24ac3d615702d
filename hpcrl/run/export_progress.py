"""Progress lines of an export: ``python -m hpcrl.core.export`` (job side) writes them to its
output, ``hpcrl export --wait`` (login side) shows the newest from the export job's log
(``newest_progress``). An 8B model's conversion reads and writes tens of GiB for minutes, so
each phase is said as it starts, with the time since the export began."""

from __future__ import annotations

import time
from pathlib import Path

import attrs

from hpcrl.config.shared_methods import SharedMethods

PROGRESS_PREFIX = "hpcrl export: "


@attrs.frozen
class ExportProgress(SharedMethods):
    """Picklable (the Megatron export says its phases from a spawned child)."""

    started_s: float = attrs.field(factory=time.monotonic)
    quiet: bool = False

    def __call__(self, text: str) -> None:
        if self.quiet:
            return
        elapsed_s = time.monotonic() - self.started_s
        print(f"{PROGRESS_PREFIX}[{elapsed_s:5.0f} s] {text}", flush=True)


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


def newest_progress(log_path: str | Path, tail_bytes: int = 8192) -> str | None:
    """The newest progress line of an export's log (without its prefix); None before the
    first, or while the log cannot be read."""
    try:
        with open(log_path, "rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - tail_bytes))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [line for line in tail.splitlines() if line.startswith(PROGRESS_PREFIX)]
    return lines[-1].removeprefix(PROGRESS_PREFIX) if lines else None
