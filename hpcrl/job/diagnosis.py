"""Node 0 names why an attempt failed: the record ``status/cause.<r>.json`` (``hpcrl.run.causes``).

Evidence, strongest first: another node's own report (``status/node<k>.failed``: its Ray
exited, so the node is lost for this attempt); the driver's report of what it raised
(``status/driver.error``, written by ``hpcrl.job.driver_process``: a worker rank that
raised or died, or the driver's own exception); how the driver process ended (killed by a
signal, or an exit code). Only a lost node is worth another attempt (``hpcrl.run.causes``).
Nothing here imports Ray: node 0's entrypoint runs it after its driver has exited.
"""

from __future__ import annotations

import signal
from typing import Any, TypedDict

from hpcrl.job.errors import BootstrapError
from hpcrl.job.settings import NodeSettings
from hpcrl.run.causes import (
    DRIVER_EXITED,
    DRIVER_KILLED,
    DRIVER_RAISED,
    GPU_OOM,
    GPU_OOM_ERROR,
    NODE_LOST,
    WORKER_DIED,
    WORKER_RAISED,
    AttemptCause,
    exit_code_of,
    last_step,
    parse_gpu_oom,
)
from hpcrl.run.markers import DRIVER_ERROR, RAY_READY, node_failures, node_log_dir, read_marker
from hpcrl.run.polling import wait_until

#: A node's own report may land a moment after the driver saw the failure it caused.
LATE_REPORT_S = 5.0
_SIGNAL_HINTS = {
    signal.SIGKILL: "out of memory?",
    signal.SIGTERM: "cancelled, or the job step was ended",
    signal.SIGSEGV: "crashed",
    signal.SIGBUS: "crashed",
    signal.SIGABRT: "aborted",
}
_WORKER_FIELDS = ("rank", "node_ip", "died", "method", "role")


class _AttemptFields(TypedDict):
    """The ``AttemptCause`` fields every cause of one attempt shares."""

    attempt: int
    after_step: int | None
    exit_code: int
    log: str | None


def describe_driver_error(error: BaseException) -> dict[str, Any]:
    """The fields of ``status/driver.error`` for an exception the driver raised; a worker
    failure (``hpcrl.core.workers.failures.WorkerFailed``, read by its attributes so this
    module needs no training code) names the rank."""
    from hpcrl.config.secrets import redact  # an exception may quote a secret's value

    if all(hasattr(error, name) for name in _WORKER_FIELDS):
        fields = {name: getattr(error, name) for name in _WORKER_FIELDS}
        message = str(error.message)  # type: ignore[attr-defined]
        return fields | {"error_type": error.error_type, "message": redact(message)}  # type: ignore[attr-defined]
    lines = str(error).strip().splitlines()
    return {"error_type": type(error).__name__, "message": redact(lines[0] if lines else "")}


def diagnose(
    settings: NodeSettings, returncode: int, wait_s: float = LATE_REPORT_S
) -> AttemptCause:
    """Why this attempt's driver ended with ``returncode`` (``Popen.returncode``: negative
    for a signal); ``requeued`` is left False (the caller decides)."""
    attempt_id = settings.task.attempt_id
    driver_error = read_marker(settings.run_dir, DRIVER_ERROR, attempt_id)
    failures = _node_failures(settings, wait_s if _may_follow_a_node(driver_error) else 0.0)
    base: _AttemptFields = {
        "attempt": settings.task.run_attempt,
        "after_step": last_step(settings.run_dir),
        "exit_code": exit_code_of(returncode),
        "log": _relative(settings, node_log_dir(settings.run_dir, 0, settings.task.run_attempt) / "driver.log"),
    }  # fmt: skip
    if failures:
        rank, marker = failures[0]
        log = marker.get("log") or _relative(
            settings, node_log_dir(settings.run_dir, rank, settings.task.run_attempt) / "node.log"
        )
        return AttemptCause(
            **base | {"log": log}, kind=NODE_LOST, what=f"node {_node(settings, rank)} lost",
            detail=str(marker.get("detail") or _first_line(marker.get("message", ""))),
        )  # fmt: skip
    if driver_error is not None and "rank" in driver_error:
        return _worker_cause(settings, driver_error, base)
    if driver_error is not None:
        what = f"driver raised {driver_error.get('error_type', 'an exception')}"
        return AttemptCause(
            **base, kind=DRIVER_RAISED, what=what, detail=str(driver_error.get("message", ""))
        )
    if returncode < 0:
        return AttemptCause(**base, kind=DRIVER_KILLED, what=f"driver {killed_by(-returncode)}")
    return AttemptCause(**base, kind=DRIVER_EXITED, what=f"driver exited with code {returncode}")


def head_lost(
    settings: NodeSettings, error: BootstrapError, returncode: int | None
) -> AttemptCause:
    """Node 0's own Ray exited while its driver ran: node 0 is lost for this attempt."""
    del returncode  # the driver was stopped because of it; its code says nothing more
    return AttemptCause(
        attempt=settings.task.run_attempt, kind=NODE_LOST, what=f"node {_node(settings, 0)} lost",
        detail=error.detail or _first_line(str(error)), after_step=last_step(settings.run_dir),
        exit_code=1, log=error.log,
    )  # fmt: skip


def killed_by(signum: int) -> str:
    """``killed by signal 9 (SIGKILL: out of memory?)``."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"killed by signal {signum}"
    hint = _SIGNAL_HINTS.get(signal.Signals(signum))
    return f"killed by signal {signum} ({name}{': ' + hint if hint else ''})"


def _worker_cause(
    settings: NodeSettings, error: dict[str, Any], base: _AttemptFields
) -> AttemptCause:
    role, rank = error.get("role") or "worker rank", error["rank"]
    node = _node_of_ip(settings, error.get("node_ip"))
    where = f"{role} {rank}" + (f" on node {node}" if node else "")
    method = error.get("method") or "a call"
    if error.get("died"):
        return AttemptCause(
            **base, kind=WORKER_DIED, what=f"{where} died in {method}", detail=str(error.get("message", ""))
        )  # fmt: skip
    message = str(error.get("message", ""))
    oom = parse_gpu_oom(message) if error.get("error_type") == GPU_OOM_ERROR else None
    if oom is not None:  # out of GPU memory at <phase>, peak X GiB: the line starts with it
        head, peak_gb, detail = oom
        return AttemptCause(
            **base, kind=GPU_OOM, what=head, detail=f"{where} in {method}: {detail}".rstrip(": "),
            peak_gpu_mem_gb=peak_gb,
        )  # fmt: skip
    what = f"{where} raised {error.get('error_type', 'an exception')} in {method}"
    return AttemptCause(**base, kind=WORKER_RAISED, what=what, detail=message)


def _may_follow_a_node(driver_error: dict[str, Any] | None) -> bool:
    """A Python exception raised by a worker is its own cause; anything else (a dead worker,
    a killed driver, a collective error) may be the echo of a node that is going away."""
    return driver_error is None or bool(driver_error.get("died")) or "rank" not in driver_error


def _node_failures(settings: NodeSettings, wait_s: float) -> list[tuple[int, dict[str, Any]]]:
    ranks = range(1, settings.num_nodes)
    found: list[tuple[int, dict[str, Any]]] = []

    def reported() -> bool:
        found[:] = node_failures(settings.run_dir, settings.task.attempt_id, ranks)
        return bool(found)

    if settings.num_nodes > 1:
        wait_until(reported, wait_s, interval_s=0.2)
    return found


def _node(settings: NodeSettings, rank: int) -> str:
    names = settings.task.node_names
    return f"{rank} ({names[rank]})" if rank < len(names) else str(rank)


def _node_of_ip(settings: NodeSettings, ip: Any) -> str | None:
    """``1 (n2)`` for the node whose Ray IP is ``ip``, from ``status/ray_ready``; None when
    the IP is unknown or not unique (simulated nodes sharing one address)."""
    ready = read_marker(settings.run_dir, RAY_READY, settings.task.attempt_id) or {}
    ips = ready.get("node_ips") or []
    if not isinstance(ip, str) or ips.count(ip) != 1:
        return None
    return _node(settings, ips.index(ip))


def _relative(settings: NodeSettings, path: Any) -> str:
    try:
        return str(path.relative_to(settings.run_dir))
    except ValueError:
        return str(path)


def _first_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""
