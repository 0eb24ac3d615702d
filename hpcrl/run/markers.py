"""The job's files in the run folder: progress markers under ``status/``, logs under ``logs/``.

Markers are small JSON files written atomically (temp file + rename) so a reader on another
node never sees half a file. Each carries the ``attempt`` (``<job_id>.<restart_count>``):
after a requeue the folder still holds the previous attempt's markers, and readers ignore them.

- ``status/head``: node 0, once its own Ray is up (its raylet registered); a worker joins
  only a head announced for its own attempt (never another job's head on the same port).
- ``status/ray_ready``: node 0, once every node joined (``num_nodes``, ``node_ips``, times).
- ``status/done``: node 0, when the driver finished (``exit_code``); workers then stop.
- ``status/node<k>.failed``: node k's failure (``message``; ``detail`` and ``log`` when known).
- ``status/driver.error``: node 0's driver raised (``error_type``, ``message``; ``rank``,
  ``node_ip``, ``died``, ``method``, ``role`` when a worker failed: hpcrl.job.diagnosis).
- ``status/cause.<r>.json``: why attempt r ended early, in one line (``hpcrl.run.causes``).
- ``PREEMPT`` (run folder root): asks the training driver to checkpoint and exit with code 3.
- ``logs/node<k>/attempt<r>/``: ``node.log`` (this entrypoint), ``ray.out``/``ray.err``,
  ``driver.log`` (node 0).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

HEAD = "head"
RAY_READY = "ray_ready"
DONE = "done"
DRIVER_ERROR = "driver.error"
PREEMPT_FILE = "PREEMPT"
#: The driver's exit code after it saved a checkpoint because PREEMPT appeared.
PREEMPTED_EXIT_CODE = 3
#: Written by the training driver when ``checkpointing.checkpoint_must_save_by`` stopped it
#: after saving (fields ``step``, ``checkpoint``); it exits with PREEMPTED_EXIT_CODE then, and
#: the node entrypoint names that end instead of calling it a failure.
SAVE_DEADLINE = "save_deadline"


def status_dir(run_dir: Path) -> Path:
    return run_dir / "status"


def node_log_dir(run_dir: Path, node_rank: int, attempt: int) -> Path:
    return run_dir / "logs" / f"node{node_rank}" / f"attempt{attempt}"


def failed_marker_name(node_rank: int) -> str:
    return f"node{node_rank}.failed"


def write_marker(run_dir: Path, name: str, attempt_id: str, **fields: Any) -> Path:
    """Write ``status/<name>`` atomically with the attempt id, wall time and ``fields``."""
    folder = status_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    partial = folder / f".{name}.{os.getpid()}.tmp"
    partial.write_text(json.dumps({"attempt": attempt_id, "time": time.time(), **fields}))
    partial.replace(path)
    return path


def read_marker(run_dir: Path, name: str, attempt_id: str) -> dict[str, Any] | None:
    """The marker's fields when it exists and belongs to this attempt, else None."""
    try:
        content = json.loads((status_dir(run_dir) / name).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return content if content.get("attempt") == attempt_id else None


def node_failures(run_dir: Path, attempt_id: str, ranks: range) -> list[tuple[int, dict[str, Any]]]:
    """``(rank, marker)`` of every node among ``ranks`` that reported a failure, first first."""
    found = []
    for rank in ranks:
        marker = read_marker(run_dir, failed_marker_name(rank), attempt_id)
        if marker is not None:
            found.append((rank, marker))
    return sorted(found, key=lambda item: (item[1].get("time", 0.0), item[0]))


def first_failure(run_dir: Path, attempt_id: str, ranks: range) -> tuple[int, str] | None:
    """``(rank, message)`` of the first node among ``ranks`` that reported a failure."""
    for rank in ranks:
        marker = read_marker(run_dir, failed_marker_name(rank), attempt_id)
        if marker is not None:
            return rank, marker["message"]
    return None
