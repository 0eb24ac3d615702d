"""Why an attempt of a job ended early: one small record per attempt, ``status/cause.<r>.json``.

Node 0's entrypoint writes it (``hpcrl.job.diagnosis``) when the driver exits nonzero, and
when a preemption signal stops it; ``r`` is the attempt's number in the run (0 for the first
attempt, as in ``logs/node<k>/attempt<r>/``: a job ``hpcrl resume`` submitted counts on after
the earlier jobs' attempts). The login side (``hpcrl status``, ``submit
--wait``, ``logs``) reads it back and shows ``AttemptCause.line()``: what died or raised,
where, after which step, whether the job was requeued, and which log to read. Shared by both
sides, so standard library and attrs only.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.shared_methods import SharedMethods
from hpcrl.run.metrics_file import METRICS_FILE

STATUS_DIR = "status"

#: How a driver killed by a signal ends, as a shell reports it (and Slurm's 0:9 becomes).
SIGNAL_EXIT_BASE = 128
_METRICS_TAIL_BYTES = 65536

#: ``kind`` values. Only a lost node is worth another attempt: the same code on the same data
#: would raise or run out of memory again.
NODE_LOST = "node_lost"
WORKER_RAISED = "worker_raised"
WORKER_DIED = "worker_died"
DRIVER_RAISED = "driver_raised"
DRIVER_KILLED = "driver_killed"
DRIVER_EXITED = "driver_exited"
HEAD_RAY_EXITED = "head_ray_exited"
PREEMPTED = "preempted"
#: ``checkpointing.checkpoint_must_save_by`` reached: the driver saved and stopped unfinished.
SAVE_DEADLINE_REACHED = "save_deadline"
#: Slurm ended the attempt NODE_FAIL: a node's slurmd stopped answering (``slurm_node_failure``).
NODE_FAIL = "node_fail"
#: A training worker ran out of GPU memory: ``what`` says where and the peak
#: (``gpu_oom_text``), ``peak_gpu_mem_gb`` holds it for ``hpcrl report``.
GPU_OOM = "gpu_oom"
#: The exception a training worker raises for CUDA's out-of-memory error
#: (``hpcrl.core.workers.out_of_memory``), read here by its type name.
GPU_OOM_ERROR = "GpuOutOfMemory"
_GPU_OOM_TEXT = re.compile(
    r"^out of GPU memory at (?P<phase>\w+), peak (?P<peak>[0-9.]+ GiB|unknown)"
    r"(?: of (?P<capacity>[0-9.]+) GiB)?(?:: (?P<detail>.*))?$"
)
RETRYABLE_KINDS = frozenset({NODE_LOST, NODE_FAIL})
#: What srun prints into the batch step's stderr (task 0's ``submitit/<job>_0_log.err``) when
#: slurmctld declares a node of the step DOWN.
_SRUN_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)", re.MULTILINE)
#: ``hpcrl.run.attempt_banner``: where each attempt starts in a task's log.
_ATTEMPT_BANNER = re.compile(r"^===== hpcrl attempt (\d+) · ", re.MULTILINE)
#: The first line of ``logs/node<k>/attempt<r>/node.log`` (``hpcrl.job.node.run_node``).
_NODE_LOG_PLACE = re.compile(r" node (\d+) of \d+ \((\S+?), ")
NODE_FAIL_DETAIL = (
    "its slurmd stopped answering (Slurm marked the node DOWN and ended the attempt NODE_FAIL)"
)


@attrs.frozen(kw_only=True)
class AttemptCause(SharedMethods):
    """One attempt's end. ``what`` names the failure and its place ("node 1 (n2) lost",
    "worker rank 1 on node 1 (n2) raised ValueError: bad"); ``detail`` says more about it
    ("its Ray exited: raylet killed by signal 9"); ``log`` is relative to the run folder."""

    attempt: int  # the attempt in the run: 0 for the first (SlurmTask.run_attempt)
    kind: str
    what: str
    detail: str = ""
    after_step: int | None = None  # the last step metrics.jsonl recorded, None if none
    exit_code: int = 1
    requeued: bool = False
    log: str | None = None
    peak_gpu_mem_gb: float | None = None  # GPU_OOM: the worker's peak when it ran out

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS

    def line(self) -> str:
        """One line: ``node 1 (n2) lost after step 3: its Ray exited (raylet killed by signal
        9); exit code 1; requeued (log: logs/node1/attempt0/node.log)``."""
        text = self.what
        if self.after_step is not None:
            text += f" after step {self.after_step}"
        if self.detail:
            text += f": {self.detail}"
        # (a driver's exit says its code already; Slurm's NODE_FAIL ends the job without one)
        if self.kind not in (PREEMPTED, DRIVER_EXITED, NODE_FAIL, SAVE_DEADLINE_REACHED):
            text += f"; exit code {self.exit_code}"
        if self.requeued:
            text += "; requeued, the next attempt resumes from the last checkpoint"
        if self.log:
            text += f" (log: {self.log})"
        from hpcrl.config.secrets import redact  # the record is a file: it may hold anything

        return redact(" ".join(text.split()))

    def titled_line(self) -> str:
        """``attempt 1: <line>`` (attempts counted from 1, as ``hpcrl logs --attempt``)."""
        return f"attempt {self.attempt + 1}: {self.line()}"


def gpu_oom_text(phase: str, peak_gb: float | None, capacity_gb: float | None, detail: str) -> str:
    """``out of GPU memory at train, peak 131.2 GiB of 139.8 GiB: CUDA out of memory. ...``:
    the first line of a worker's ``GpuOutOfMemory`` (``parse_gpu_oom`` reads it back)."""
    peak = "unknown" if peak_gb is None else f"{peak_gb:.1f} GiB"
    capacity = "" if capacity_gb is None else f" of {capacity_gb:.1f} GiB"
    first = (detail.strip().splitlines() or [""])[0]
    return f"out of GPU memory at {phase}, peak {peak}{capacity}" + (f": {first}" if first else "")


def parse_gpu_oom(text: str) -> tuple[str, float | None, str] | None:
    """(the head ``out of GPU memory at <phase>, peak X GiB[ of Y GiB]``, the peak in GiB,
    the detail after it) of a ``gpu_oom_text``; None for any other text."""
    match = _GPU_OOM_TEXT.match(text.strip())
    if match is None:
        return None
    peak = match["peak"]
    peak_gb = None if peak == "unknown" else float(peak.removesuffix(" GiB"))
    head = text.strip()[: match.start("detail") - 2] if match["detail"] else text.strip()
    return head, peak_gb, match["detail"] or ""


def cause_path(run_dir: Path, attempt: int) -> Path:
    return Path(run_dir) / STATUS_DIR / f"cause.{attempt}.json"


def write_cause(run_dir: Path, cause: AttemptCause) -> Path:
    """Write the record atomically; secret values in the text are hidden first (an exception
    message may quote an environment variable)."""
    from hpcrl.config.secrets import redact
    from hpcrl.run.atomic_files import write_file

    path = cause_path(run_dir, cause.attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_file(path, redact(json.dumps(attrs.asdict(cause), indent=1)) + "\n")


def read_causes(run_dir: Path) -> list[AttemptCause]:
    """Every readable record, by attempt; a damaged or foreign file is left out."""
    found = []
    for path in (Path(run_dir) / STATUS_DIR).glob("cause.*.json"):
        cause = _read(path)
        if cause is not None:
            found.append(cause)
    return sorted(found, key=lambda cause: cause.attempt)


def read_cause(run_dir: Path, attempt: int) -> AttemptCause | None:
    """The record of one attempt (its number in the run), None when it has none or it is
    unreadable."""
    cause = _read(cause_path(run_dir, attempt))
    return cause if cause is not None and cause.attempt == attempt else None


def latest_cause(run_dir: Path) -> AttemptCause | None:
    causes = read_causes(run_dir)
    return causes[-1] if causes else None


def _read(path: Path) -> AttemptCause | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not _well_typed(data):
        return None
    names = {field.name for field in attrs.fields(AttemptCause)}
    return AttemptCause(**{key: value for key, value in data.items() if key in names})


_TYPES: dict[str, tuple[type, ...]] = {
    "attempt": (int,), "kind": (str,), "what": (str,), "detail": (str,),
    "after_step": (int, type(None)), "exit_code": (int,), "requeued": (bool,),
    "log": (str, type(None)), "peak_gpu_mem_gb": (float, int, type(None)),
}  # fmt: skip
_REQUIRED = ("attempt", "kind", "what")


def _well_typed(data: dict[str, Any]) -> bool:
    if any(name not in data for name in _REQUIRED):
        return False
    for name, kinds in _TYPES.items():
        value = data.get(name)
        if name not in data:
            continue
        if isinstance(value, bool) and bool not in kinds:
            return False
        if not isinstance(value, kinds):
            return False
    attempt: int = data["attempt"]  # an int: checked above
    return attempt >= 0


def slurm_node_failure(
    run_dir: Path, attempt: int, task0_err_log: Path, requeued: bool
) -> AttemptCause | None:
    """The cause of an attempt that Slurm ended NODE_FAIL, from srun's ``Node failure on
    <node>`` in task 0's stderr (that attempt's part of it); None when srun said no such thing.
    Node 0 could not say it itself: the whole step was killed. The next attempt's node 0
    writes it (``hpcrl.job.node``); until then, or when no attempt follows, the login side
    reads it the same way (``hpcrl.submit.job_state``). The step is the last one recorded:
    right while no later attempt trains."""
    try:
        text = Path(task0_err_log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    nodes = _SRUN_NODE_FAILURE.findall(_attempt_part(text, attempt))
    if not nodes:
        return None
    log = Path(task0_err_log)
    try:
        log = log.relative_to(run_dir)
    except ValueError:
        pass
    return AttemptCause(
        attempt=attempt, kind=NODE_FAIL, what=f"node {_node_place(run_dir, attempt, nodes[0])} lost",
        detail=NODE_FAIL_DETAIL, after_step=last_step(run_dir), exit_code=1, requeued=requeued,
        log=str(log),
    )  # fmt: skip


def _attempt_part(text: str, attempt: int) -> str:
    """The lines of a task log from ``attempt``'s banner (attempts counted from 1 in it) to the
    next banner; all of it when it has no banners."""
    banners = list(_ATTEMPT_BANNER.finditer(text))
    if not banners:
        return text
    starts = [match.start() for match in banners] + [len(text)]
    parts = [
        text[start:end]
        for match, start, end in zip(banners, starts, starts[1:], strict=False)
        if int(match.group(1)) == attempt + 1
    ]
    return "".join(parts)


def _node_place(run_dir: Path, attempt: int, name: str) -> str:
    """``1 (n2)``: the node's rank in that attempt, from the node logs' first lines."""
    for log in sorted(Path(run_dir).glob(f"logs/node*/attempt{attempt}/node.log")):
        try:
            with open(log, encoding="utf-8", errors="replace") as stream:
                head = stream.read(4096)
        except OSError:
            continue
        match = _NODE_LOG_PLACE.search(head)
        if match and match.group(2) == name:
            return f"{match.group(1)} ({name})"
    return name


def last_step(run_dir: Path) -> int | None:
    """The ``step`` of the last complete line of ``metrics.jsonl`` (None without one)."""
    path = Path(run_dir) / METRICS_FILE
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - _METRICS_TAIL_BYTES))
            lines = stream.read().decode("utf-8", errors="replace").split("\n")
    except OSError:
        return None
    for line in reversed(lines[:-1]):  # the part after the last newline may be half written
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool):
            return step if step >= 1 else None  # step 0: the validation before step 1
    return None


def exit_code_of(returncode: int) -> int:
    """A process's exit status as the job reports it: a signal ``n`` becomes 128 + n."""
    return SIGNAL_EXIT_BASE - returncode if returncode < 0 else returncode
