"""Node 0's training driver: its start beside the Ray head, and the watch over both.

The driver starts together with the head (its Python and Ray imports overlap the head's
start-up) and waits for the GCS itself. When the head's raylet misses Ray's registration
window before any worker was told to join (``RayNode.check_alive`` starts it once more), the
driver starts again too: Ray's GCS client aborts its process on a GCS that restarted under it
("WrongClusterID"), which no ``except`` can catch.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Mapping

from hpcrl.job.driver_process import ATTEMPT_VARIABLE
from hpcrl.job.processes import start_in_own_session
from hpcrl.job.ray_cluster import RayNode, ray_environment
from hpcrl.job.settings import TORCH_MASTER_PORT_VARIABLE, NodeSettings
from hpcrl.run.markers import node_failures, node_log_dir

NODE_FAILURES_POLL_S = 1.0  # node 0 looks for other nodes' failure reports this often
# Once another node reported a failure, the driver gets this long to fail on its own (a
# collective with a dead peer can wait far longer) before it is stopped.
NODE_FAILURE_GRACE_S = 15.0


def start_driver(settings: NodeSettings, environ: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """The driver process of this attempt, logging into ``driver.log`` (appended)."""
    log_dir = node_log_dir(settings.run_dir, 0, settings.task.run_attempt)
    driver_env = ray_environment(environ, settings) | {
        "RAY_ADDRESS": settings.gcs_address,
        "PYTHONUNBUFFERED": "1",
        ATTEMPT_VARIABLE: str(settings.task.attempt),
        # The training group's rendezvous port, from the job's band like Ray's ports.
        TORCH_MASTER_PORT_VARIABLE: str(settings.ray_ports.torch_master_port),
    }
    return start_in_own_session(
        [sys.executable, "-u", "-m", "hpcrl.job.driver_process", str(settings.run_dir)],
        env=driver_env, stdout_path=log_dir / "driver.log", stderr_path=log_dir / "driver.log",
    )  # fmt: skip


def watch_driver(
    settings: NodeSettings,
    driver: subprocess.Popen[bytes],
    ray_node: RayNode,
    logger: logging.Logger,
) -> bool:
    """Until the driver exits: this node's Ray must live (RayExited), and when another node
    reports a failure the driver gets NODE_FAILURE_GRACE_S to fail on its own, then the watch
    ends (the caller stops it). True when the head's Ray started again: the driver must too."""
    next_look_s = failed_since_s = None
    while driver.poll() is None:
        if ray_node.check_alive():
            logger.warning("starting the driver again: the Ray head it waited for is a new one")
            return True
        now_s = time.monotonic()
        if failed_since_s is None and (next_look_s is None or now_s >= next_look_s):
            next_look_s = now_s + NODE_FAILURES_POLL_S
            reports = node_failures(settings.run_dir, settings.task.attempt_id,
                                    range(1, settings.num_nodes))  # fmt: skip
            if reports:
                failed_since_s = now_s
                logger.error("node %d reported a failure: %s", reports[0][0],
                             reports[0][1].get("message", "").splitlines()[:1])  # fmt: skip
        if failed_since_s is not None and now_s - failed_since_s >= NODE_FAILURE_GRACE_S:
            logger.error("driver still running %.0fs after a node failed; stopping it",
                         NODE_FAILURE_GRACE_S)  # fmt: skip
            return False
        time.sleep(0.2)  # short polls keep submitit's USR2 handler responsive
    return False
