"""The training driver's phase, for ``hpcrl submit --wait`` (``hpcrl.submit.progress``).

``status/phase`` holds what the driver is doing now (loading the model and data, starting the
workers, loading the checkpoint of step N, validating, training from step K), stamped with
the attempt (``<job>.<restart>``, from ``$HPCRL_ATTEMPT_ID``, which the job's driver process
sets) so that a follower never takes an earlier attempt's phase for this one's. Written
atomically (temp file + rename), as the node entrypoint's markers are; outside a job (no
attempt id) nothing is written.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

#: Set by hpcrl.job.driver_process to the attempt id of its markers.
ATTEMPT_ID_VARIABLE = "HPCRL_ATTEMPT_ID"
PHASE_FILE = "phase"  # under status/, beside the node entrypoint's markers


def report_phase(run_dir: Path, phase: str, **fields: Any) -> None:
    """Say what the driver does now (``fields``: e.g. ``first_step`` when training starts)."""
    attempt = os.environ.get(ATTEMPT_ID_VARIABLE)
    if not attempt:
        return
    folder = Path(run_dir) / "status"
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{PHASE_FILE}.{os.getpid()}.tmp"
    record = {"attempt": attempt, "time": time.time(), "phase": phase, **fields}
    partial.write_text(json.dumps(record))
    partial.replace(folder / PHASE_FILE)
