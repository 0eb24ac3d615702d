"""A failed call on a group of Ray actors, named by the rank that failed.

``ray.get`` over every rank's result raises the first error it meets, as soon as it meets
it (the other ranks may still be blocked in a collective waiting for the failed one). The
error names an actor id, not a rank. ``get_all`` turns it into ``WorkerFailed``, naming the
rank, its node and what happened there: a Python exception (``raised ValueError: ...``) or
a process that died (killed, out of memory, or its node's Ray gone). When several ranks
failed, a dead one is the cause and the others' collective errors its consequence.

The node entrypoint reads the attributes of ``WorkerFailed`` (``rank``, ``node_ip``,
``died``, ``error_type``, ``message``, ``method``) to name the cause of the attempt
(``hpcrl.job.diagnosis``); keep them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: How long to look at the other ranks' results once one failed: enough for a dead
#: worker's error to arrive after the collective error it caused on its peer.
SETTLE_S = 2.0


class WorkerFailed(RuntimeError):
    """``method`` failed on ``role`` ``rank`` (on the node with ``node_ip``); ``role`` is
    "worker rank" for the training group, "generation engine" for vLLM's engines."""

    def __init__(
        self, *, rank: int, node_ip: str | None, method: str, died: bool,
        error_type: str, message: str, role: str = "worker rank",
    ) -> None:  # fmt: skip
        where = f"{role} {rank}" + (f" ({node_ip})" if node_ip else "")
        happened = f"died ({message})" if died else f"raised {error_type}: {message}"
        super().__init__(f"{where} {happened} in {method}")
        self.rank, self.node_ip, self.method, self.died = rank, node_ip, method, died
        self.error_type, self.message, self.role = error_type, message, role


def get_all(
    refs: Sequence[Any], method: str, node_ips: Sequence[str | None] = (), *,
    timeout_s: float | None = None, role: str = "worker rank",
) -> list[Any]:  # fmt: skip
    """``ray.get(refs)`` in rank order; a failure on any rank raises ``WorkerFailed``."""
    import ray

    try:
        return ray.get(list(refs), timeout=timeout_s)
    except ray.exceptions.RayError as error:
        failed = failed_ranks(refs)
        if not failed:
            raise
        rank, cause = failed[0]
        ip = node_ips[rank] if rank < len(node_ips) else None
        raise worker_failed(rank, ip, method, cause, role) from error


def failed_ranks(refs: Sequence[Any]) -> list[tuple[int, Exception]]:
    """``(rank, error)`` of every rank whose result is an error now, dead workers first."""
    import ray

    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=SETTLE_S)
    ready_ids = {ref.hex() for ref in ready}
    failed = []
    for rank, ref in enumerate(refs):
        if ref.hex() not in ready_ids:
            continue
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayError as error:
            failed.append((rank, error))
    return sorted(failed, key=lambda item: (not _died(item[1]), item[0]))


def worker_failed(
    rank: int, node_ip: str | None, method: str, error: Exception, role: str = "worker rank"
) -> WorkerFailed:
    """``WorkerFailed`` for ``error``, a rank's result: its process died, or it raised."""
    if _died(error):
        died, error_type, message = True, type(error).__name__, _death_reason(error)
    else:
        cause = getattr(error, "cause", None)  # RayTaskError: the exception the worker raised
        raised = cause if isinstance(cause, BaseException) else error
        lines = str(raised).strip().splitlines()
        died, error_type, message = False, type(raised).__name__, lines[0] if lines else ""
    return WorkerFailed(
        rank=rank, node_ip=node_ip, method=method, died=died, error_type=error_type,
        message=message, role=role,
    )  # fmt: skip


def _died(error: Exception) -> bool:
    import ray

    return isinstance(error, ray.exceptions.RayActorError | ray.exceptions.WorkerCrashedError)


def _death_reason(error: Exception) -> str:
    """Ray's reason in a few words: its message is a paragraph of possible causes."""
    text = str(error)
    for marker, reason in (
        ("node has died", "its node's Ray is gone"),
        ("is unavailable", "unreachable: its node's Ray is gone?"),
        ("connection error code", "its process exited unexpectedly: killed, or out of memory?"),
    ):
        if marker in text:
            return reason
    first = text.strip().splitlines()
    return first[0] if first else type(error).__name__
