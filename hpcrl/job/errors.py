"""Named failures of the in-job bootstrap. Each message says what failed, where, and after how long.

They are raised on the node that sees the failure; the node entrypoint also writes the message
into the run folder (``status/node<k>.failed``) so the other nodes and ``hpcrl status`` can
show the cause instead of waiting for their own deadlines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrl.config.errors import Problem


class BootstrapError(RuntimeError):
    """The per-node Ray bootstrap failed; ``str(error)`` is the full message for the user.

    ``detail``: what happened in a few words, for the attempt's one-line cause (empty: the
    message's first line serves); ``log``: the file that tells more."""

    detail: str = ""
    log: str | None = None


class NodeSettingsError(BootstrapError):
    """The job's environment or jobspec.json does not give a usable node configuration."""


class HeadUnreachable(BootstrapError):
    """A worker could not reach this job's Ray head within its deadline."""

    def __init__(self, ip: str, port: int, waited_s: float, foreign_listener: bool = False):
        cause = (
            "something answers on that port but node 0 of this job never announced its head "
            "(status/head): another job's Ray on the same port?"
            if foreign_listener
            else "is node 0 up? see its log under logs/node0/; raise HPCRL_HEAD_WAIT_S if the "
            "head node is only slow to start"
        )
        super().__init__(f"head unreachable at {ip}:{port} after {waited_s:.0f}s ({cause})")
        self.ip, self.port = ip, port


class PortInUse(BootstrapError):
    """A fixed Ray port is already taken on this node."""

    def __init__(self, port: int, port_name: str, node_name: str, ip: str, holder: str):
        super().__init__(
            f"port {port} already in use on node {node_name} ({ip}; ray_ports.{port_name}): "
            f"held by {holder} (a second job on a shared node? a stale Ray?); change "
            f"ray_ports.{port_name} in the cluster profile or free the port"
        )
        self.port, self.port_name, self.node_name = port, port_name, node_name
        self.holder = holder


class NodesMissing(BootstrapError):
    """Not every node of the job registered with the Ray head before the join deadline."""

    def __init__(self, num_joined: int, num_nodes: int, waited_s: float, missing: list[str]):
        super().__init__(
            f"only {num_joined} of {num_nodes} nodes joined after {waited_s:.0f}s "
            f"(missing: {', '.join(missing)}); see logs/node<k>/ of the missing nodes"
        )
        self.missing = missing


class OtherNodeFailed(BootstrapError):
    """Another node of the same attempt reported a bootstrap failure."""


class RayExited(BootstrapError):
    """This node's own ``ray start --block`` process ended while it was still needed."""

    def __init__(self, message: str, detail: str = "", log: str | None = None) -> None:
        super().__init__(message)
        self.detail, self.log = detail, log


class DriverFailed(RuntimeError):
    """The training driver on node 0 exited nonzero; raised so submitit marks the job failed.
    ``cause``: the attempt's one-line cause (``status/cause.<r>.json``), when named."""

    def __init__(
        self, exit_code: int, driver: str, log_tail: str, log_path: str = "", cause: str = ""
    ):
        because = f" ({cause})" if cause else ""
        super().__init__(
            f"driver {driver} exited with code {exit_code}{because}; last lines of its log:\n"
            f"{log_tail}"
        )
        self.exit_code = exit_code
        #: One line for the task's stderr (the traceback, if any, is in the driver's log).
        self.summary = f"driver {driver} exited with code {exit_code}{because}" + (
            f" (its log: {log_path})" if log_path else ""
        )


class RequeueRequested(RuntimeError):
    """The attempt failed in a way another attempt may not (a node was lost) and requeues are
    left: ``hpcrl.job.node_task.NodeTask`` requeues the job with ``resubmission``."""

    def __init__(self, resubmission: object, cause: str) -> None:
        super().__init__(f"requeueing the job: {cause}")
        self.resubmission, self.cause = resubmission, cause


class SlurmRequeues(RuntimeError):
    """Slurm ended the attempt NODE_FAIL (a node's slurmd stopped answering) and requeues the
    job itself: task 0 leaves no result (a waiting ``--wait`` would take it for the job's end)
    and asks for no requeue of its own."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"Slurm requeues the job: {cause}")
        self.cause = cause


class PreflightFailed(BootstrapError):
    """This node's Python cannot run the job (missing or out-of-range packages, hpcrl from the
    wrong place, a machine without what the plan needs); raised before Ray starts. The message
    is one line naming every problem and its fix; ``problems`` holds them as ``Problem``
    records (empty for a plan this hpcrl cannot read)."""

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)
