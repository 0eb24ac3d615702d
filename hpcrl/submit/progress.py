"""Where a running job is, for ``--wait``'s progress line: the phase of its current attempt
and, once steps run, step N/M with an ETA.

A run folder keeps what earlier attempts wrote (``metrics.jsonl``, ``status/*``): after
``hpcrl resume`` or a requeue the last metrics line is the old attempt's step, and showing it
as progress would say "training step 10/20" while the new attempt is still starting Ray. So
every marker is taken only when it is the current attempt's (its ``<job>.<restart>`` id), and
training progress only once the current attempt's driver says it trains (``status/phase``,
written by the training driver: loading the model, starting workers, loading the checkpoint
of step N, validating, training from step K) or, for a driver that writes no phase, once
``metrics.jsonl`` changed after this attempt's Ray was ready.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from hpcrl.run.job_record import JobRecord
from hpcrl.run.metrics_file import finite_number, read_metrics_file
from hpcrl.submit.job_identity import record_time
from hpcrl.submit.job_status import JobStatus

#: The training driver's phase marker (hpcrl.core.phase writes it).
PHASE_MARKER = "phase"
RAY_READY_MARKER = "ray_ready"
#: An array task's markers carry Slurm's own id for the task, not ``<array>_<index>``: one
#: written before the record's submission (less this slack for clocks) is an earlier job's.
ARRAY_MARKER_SLACK_S = 5.0
#: The ETA is the median time of this many of the latest steps times the steps left.
ETA_STEPS = 10


def current_marker(
    run_dir: Path, name: str, record: JobRecord | None, status: JobStatus
) -> dict[str, Any] | None:
    """``status/<name>`` when the current attempt of the record's job wrote it."""
    try:
        marker = json.loads((Path(run_dir) / "status" / name).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict):
        return None
    job, _, restart = str(marker.get("attempt", "")).rpartition(".")
    if restart != str(status.attempts - 1):
        return None
    if record is None:
        return marker
    if record.array_index is None:
        return marker if job in (record.job_id, f"local{record.job_id}") else None
    written = finite_number(marker.get("time"))
    fresh = written is None or written >= record_time(record) - ARRAY_MARKER_SLACK_S
    return marker if fresh else None


def progress_of(
    run_dir: Path, status: JobStatus, max_steps: int | None, record: JobRecord | None = None
) -> tuple[str, str]:
    """(phase, line): the line says where the job is; a new phase is worth a printed line."""
    attempt = f" (attempt {status.attempts})" if status.attempts > 1 else ""
    if status.state == "PENDING" or status.state == "UNKNOWN":
        reason = f" (reason: {status.reason})" if status.reason else ""
        return "queued" + reason + attempt, f"queued{reason}{attempt}"
    if status.is_final:
        return status.state + attempt, f"{status.state.lower()}{attempt}"
    phase = current_marker(run_dir, PHASE_MARKER, record, status)
    ready = current_marker(run_dir, RAY_READY_MARKER, record, status)
    records = _this_attempts_records(run_dir, phase, ready)
    if records:
        text = f"training step {step_text(records[-1], max_steps)}{metric_text(records[-1])}"
        return "training" + attempt, text + _eta_text(records, max_steps) + attempt
    if phase is not None:
        return f"driver: {phase.get('phase')}{attempt}", f"{phase.get('phase')}{attempt}"
    if ready is not None:
        return "ray ready" + attempt, f"Ray ready, driver starting{attempt}"
    return "running" + attempt, f"running, starting Ray{attempt}"


def _this_attempts_records(
    run_dir: Path, phase: dict[str, Any] | None, ready: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The metrics lines the current attempt wrote: from the step its driver started training
    at; without a phase marker (a driver that writes none), all of them once the file changed
    after this attempt's Ray was ready."""
    if phase is not None:
        first = phase.get("first_step")
        if phase.get("phase", "").startswith("training") and isinstance(first, int):
            records = read_metrics_file(Path(run_dir)).records
            return [record for record in records if record.get("step", 0) >= first]
        return []
    if ready is None:
        return []
    try:
        changed_s = (Path(run_dir) / "metrics.jsonl").stat().st_mtime
    except OSError:
        return []
    if changed_s < (finite_number(ready.get("time")) or 0.0):
        return []  # an earlier attempt's lines
    return list(read_metrics_file(Path(run_dir)).records)


def _eta_text(records: list[dict[str, Any]], max_steps: int | None) -> str:
    """`` · ETA 12m30s``: the median of the latest steps' ``time_step_s`` times the steps
    left; '' without step times or a known last step."""
    step = records[-1].get("step")
    if not max_steps or not isinstance(step, int) or step >= max_steps:
        return ""
    times = [finite_number(record.get("time_step_s")) for record in records[-ETA_STEPS:]]
    known = [time_s for time_s in times if time_s is not None and time_s > 0]
    if not known:
        return ""
    return f" · ETA {duration(statistics.median(known) * (max_steps - step))}"


def step_text(metrics: dict[str, Any], max_steps: int | None) -> str:
    step = metrics.get("step", "?")
    return f"{step}/{max_steps}" if max_steps else f"{step}"


def metric_text(metrics: dict[str, Any]) -> str:
    parts = [
        f"{label} {metrics[name]:.4g}"
        for name, label in (("reward_mean", "reward"), ("loss", "loss"))
        if isinstance(metrics.get(name), int | float)
    ]
    return (" · " + " · ".join(parts)) if parts else ""


def duration(seconds: float) -> str:
    """``42s``, ``12m05s``, ``3h07m``: short enough to scan in a log."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
