"""A worker whose Ray goes down with the head (end of run, requeue) is no failed node; a
worker whose Ray dies while the head still serves is: it reports the failure and leaves the
attempt's end to node 0 (failing itself only when node 0 does not end it). Stand-ins for
the node's settings and its Ray process (only what ``_run_worker`` reads); the head's port
is a real socket."""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcrl.job import node
from hpcrl.job.errors import RayExited


class _DeadRay:
    """Stand-in for RayNode whose ``ray start --block`` has exited."""

    def check_alive(self) -> None:
        raise RayExited("Ray on node n2 exited with code 1 while the job still needed it; ...")


def _settings(run_dir: Path, port: int, head_wait_s: float = 0.3) -> SimpleNamespace:
    return SimpleNamespace(
        run_dir=run_dir, task=SimpleNamespace(attempt_id="37.0"), head_ip="127.0.0.1",
        ray_ports=SimpleNamespace(gcs_port=port), gcs_port=port, gcs_address=f"127.0.0.1:{port}",
        node_rank=1, head_wait_s=head_wait_s,
    )  # fmt: skip


@pytest.fixture
def head_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_ray_down_with_a_requeue_or_the_end_is_no_failure(tmp_path: Path, head_port: int) -> None:
    logger = logging.getLogger("test")
    settings = _settings(tmp_path, head_port)
    with pytest.raises(RayExited):  # the head still serves: this node's Ray died on its own
        node._run_worker(settings, _DeadRay(), logger)  # and node 0 did not end the attempt
    report = json.loads((tmp_path / "status" / "node1.failed").read_text())
    assert report["attempt"] == "37.0" and report["message"].startswith("Ray on node n2 exited")
    (tmp_path / "status" / "node1.failed").unlink()
    (tmp_path / "PREEMPT").write_text("37.0")  # node 0's checkpoint(): a requeue under way
    assert node._run_worker(settings, _DeadRay(), logger) == 0
    (tmp_path / "PREEMPT").unlink()
    (tmp_path / "status" / "done").write_text(json.dumps({"attempt": "37.0", "exit_code": 0}))
    assert node._run_worker(settings, _DeadRay(), logger) == 0
    assert not (tmp_path / "status" / "node1.failed").exists()


def test_a_worker_whose_ray_died_waits_for_node_0_to_end_the_attempt(
    tmp_path: Path, head_port: int
) -> None:
    """Exiting nonzero at once would make srun (--kill-on-bad-exit) stop node 0 before it
    named the cause; the worker reports, then returns once node 0 marked the attempt done."""
    (tmp_path / "status").mkdir()
    done = tmp_path / "status" / "done"
    threading.Timer(0.5, lambda: done.write_text(json.dumps({"attempt": "37.0"}))).start()
    settings = _settings(tmp_path, head_port, head_wait_s=60)
    assert node._run_worker(settings, _DeadRay(), logging.getLogger("test")) == 0
    assert (tmp_path / "status" / "node1.failed").exists()


def test_ray_down_after_the_head_closed_its_port_is_no_failure(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    assert node._run_worker(_settings(tmp_path, closed_port), _DeadRay(), logging.getLogger()) == 0
