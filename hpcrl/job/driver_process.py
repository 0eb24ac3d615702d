"""Node 0's driver process: connect to the head, wait for every node, run the training driver.

Run as ``python -m hpcrl.job.driver_process <run_dir>`` by the node entrypoint, in its own
process so that on USR2 (preemption/timeout) the entrypoint can ask it to checkpoint and wait
for it, which a signal handler in the same thread could not.

Contract for the driver callable (``HPCRL_DRIVER=module:function``, default
``hpcrl.core.driver:run_training``): called as ``function(run_dir: str)`` with Ray already
connected (do not call ``ray.init`` again), every node alive and each node marked by the custom
resource ``hpcrl_node_<rank>``; returns the job's exit code (``None`` counts as 0). When the file
``<run_dir>/PREEMPT`` appears it should save a checkpoint at the next step boundary and return 3.
An exception it raises is written to ``status/driver.error`` (a ``WorkerFailed`` names the
rank) for the attempt's one-line cause, and the job's exit code is 1.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable

from hpcrl.job.diagnosis import describe_driver_error
from hpcrl.job.errors import BootstrapError, NodesMissing, OtherNodeFailed
from hpcrl.job.network import port_accepts
from hpcrl.job.processes import die_with_parent
from hpcrl.job.ray_cluster import node_resource_name
from hpcrl.job.settings import NodeSettings, read_node_settings
from hpcrl.run.markers import (
    DRIVER_ERROR,
    HEAD,
    RAY_READY,
    failed_marker_name,
    first_failure,
    write_marker,
)
from hpcrl.run.polling import wait_until

NODES_POLL_INTERVAL_S = 0.2
ATTEMPT_VARIABLE = "HPCRL_ATTEMPT"
#: The attempt id the training driver's phase marker carries (hpcrl.core.phase reads it).
PHASE_ATTEMPT_VARIABLE = "HPCRL_ATTEMPT_ID"


def load_driver(spec: str) -> Callable[[str], int | None]:
    """Import ``module:function``; the error names the setting to fix."""
    module_name, colon, function_name = spec.partition(":")
    if not colon or not module_name or not function_name:
        raise BootstrapError(f"HPCRL_DRIVER={spec!r} is not of the form module:function")
    try:
        return getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise BootstrapError(f"cannot load the driver {spec!r}: {error}") from None


class GcsNodeTable:
    """Ray's node table read straight from the GCS, without connecting a driver.

    Waiting as a connected driver (``ray.init`` then ``ray.nodes()``) makes the head's raylet
    start a Python worker for the new job while the other nodes are still starting: CPU taken
    from the bootstrap. The GCS client below is what Ray itself uses to read the table on a
    joining node (``ray._private.node``): a private API, the same from Ray 2.49 (NeMo RL's
    images) to 2.60, hence the bounded range in hpcrl.plan.requirements. A Ray where it moved
    fails here by name, not with an AttributeError deep in the wait.
    """

    def __init__(self, gcs_address: str) -> None:
        import ray

        try:
            from ray._private.state import GlobalState
            from ray._raylet import GcsClientOptions

            options = GcsClientOptions.create(
                gcs_address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False
            )
            self._state = GlobalState()
            self._state._initialize_global_state(options)
        except (ImportError, AttributeError, TypeError) as error:
            raise BootstrapError(
                f"ray {ray.__version__} lacks the GCS client hpcrl reads Ray's node table with "
                f"({error}); use a Ray that hpcrl supports (hpcrl/plan/requirements.py)"
            ) from None

    def alive_ranks(self, num_nodes: int) -> dict[int, str]:
        """``{rank: node IP}`` of the job's nodes that the GCS lists as alive now."""
        ranks = {}
        for node in self._state.node_table():
            if not node["Alive"]:
                continue
            for rank in range(num_nodes):
                if node["Resources"].get(node_resource_name(rank)):
                    ranks[rank] = node["NodeManagerAddress"]
        return ranks

    def close(self) -> None:
        self._state.disconnect()


def wait_for_all_nodes(settings: NodeSettings, table: GcsNodeTable) -> dict[int, str]:
    """Poll the GCS node table until every rank is alive.

    Two deadlines: node 0's own raylet within ``head_start_s`` (a head that cannot start is
    not a missing node), then every other node within ``join_timeout_s`` (NodesMissing).
    """
    joined: dict[int, str] = {}

    def ranks_joined(count: int) -> Callable[[], bool]:
        def check() -> bool:
            try:
                alive = table.alive_ranks(settings.num_nodes)
            except Exception:  # a GCS call timing out on a busy head: ask at the next poll
                return False
            joined.clear()
            joined.update(alive)
            return 0 in joined and len(joined) >= count

        return check

    def other_node_failed() -> None:
        failure = first_failure(
            settings.run_dir, settings.task.attempt_id, range(1, settings.num_nodes)
        )
        if failure is not None:
            rank, message = failure
            raise OtherNodeFailed(
                f"node {rank} ({settings.task.node_names[rank]}) failed: {message}"
            )

    if not wait_until(ranks_joined(1), settings.head_start_s, abort=other_node_failed,
                      interval_s=NODES_POLL_INTERVAL_S):  # fmt: skip
        raise BootstrapError(
            f"Ray on node 0 ({settings.task.head_name}) did not register with its own GCS within "
            f"{settings.head_start_s:.0f}s; see logs/node0/attempt<r>/ray.err and ray-session-logs/"
        )
    # Workers start `ray start` only now: joining while the head is still starting its own
    # processes makes both slower on a busy machine, and the marker tells them it is this
    # job's head (not another job's Ray on the same port).
    write_marker(settings.run_dir, HEAD, settings.task.attempt_id, ip=settings.node_ip,
                 gcs_port=settings.gcs_port)  # fmt: skip
    start = time.monotonic()
    if not wait_until(ranks_joined(settings.num_nodes), settings.join_timeout_s,
                      abort=other_node_failed, interval_s=NODES_POLL_INTERVAL_S):  # fmt: skip
        missing = [f"node {rank} ({name})" for rank, name in enumerate(settings.task.node_names)
                   if rank not in joined]  # fmt: skip
        raise NodesMissing(len(joined), settings.num_nodes, time.monotonic() - start, missing)
    return dict(sorted(joined.items()))


def wait_for_head(settings: NodeSettings, started: float) -> None:
    """Wait for the head's GCS port (this process starts together with the head)."""
    ip, port = settings.head_ip, settings.gcs_port
    if not wait_until(lambda: port_accepts(ip, port), settings.head_start_s):
        raise BootstrapError(
            f"Ray head did not open its GCS port {ip}:{port} within {settings.head_start_s:.0f}s; "
            "see logs/node0/attempt<r>/ray.err"
        )
    log(f"Ray head's GCS port {ip}:{port} is open", started)


def log(message: str, started: float) -> None:
    """One timestamped progress line into driver.log (seconds since this process started)."""
    print(f"[hpcrl +{time.monotonic() - started:.1f}s] {message}", flush=True)


def wait_and_connect(settings: NodeSettings, started: float) -> None:
    """Wait for all nodes, write ``status/ray_ready``, then connect this process to Ray."""
    import ray

    log("imported ray; waiting for the nodes", started)
    table = GcsNodeTable(settings.gcs_address)
    try:
        node_ips = wait_for_all_nodes(settings, table)
    finally:
        table.close()
    write_marker(
        settings.run_dir, RAY_READY, settings.task.attempt_id,
        num_nodes=settings.num_nodes, node_ips=[node_ips[rank] for rank in sorted(node_ips)],
        node_names=list(settings.task.node_names),
    )  # fmt: skip
    log(f"Ray ready: {settings.num_nodes} nodes {node_ips}", started)
    ray.init(
        address=settings.gcs_address, _node_ip_address=settings.node_ip,
        log_to_driver=True, logging_level="WARNING",
    )  # fmt: skip
    log(f"connected to Ray at {settings.gcs_address}", started)


def run(run_dir: str) -> int:
    """Bootstrap, then the driver; returns the driver's exit code."""
    started = time.monotonic()
    # The entrypoint passes its attempt number: without Slurm nothing else tells it.
    settings = read_node_settings(run_dir, os.environ, int(os.environ.get(ATTEMPT_VARIABLE, "0")))
    try:
        wait_for_head(settings, started)
        wait_and_connect(settings, started)
        # Imported only now: a driver module may import torch, which takes seconds.
        driver = load_driver(settings.driver)
    except BootstrapError as error:
        write_marker(settings.run_dir, failed_marker_name(0), settings.task.attempt_id,
                     message=str(error))  # fmt: skip
        print(f"[hpcrl] bootstrap failed: {error}", file=sys.stderr, flush=True)
        return 1
    log(f"running driver {settings.driver}", started)
    # the driver stamps its phase marker with the attempt (hpcrl.core.phase)
    os.environ[PHASE_ATTEMPT_VARIABLE] = settings.task.attempt_id
    try:
        code = driver(str(settings.run_dir))
    except Exception as error:
        traceback.print_exc()
        # What node 0's entrypoint names as the attempt's cause (hpcrl.job.diagnosis).
        write_marker(settings.run_dir, DRIVER_ERROR, settings.task.attempt_id,
                     **describe_driver_error(error))  # fmt: skip
        return 1
    return 0 if code is None else int(code)


if __name__ == "__main__":
    die_with_parent()
    exit_code = run(sys.argv[1])
    try:
        import ray

        ray.shutdown()
    finally:
        sys.stdout.flush()
        os._exit(exit_code)  # Ray's atexit hooks can hang when the head is already gone
