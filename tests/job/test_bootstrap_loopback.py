"""Per-node Ray bootstrap with real Ray, without Slurm: simulated nodes on loopback.

See tests/job/simulated.py for how a node is simulated. Each test starts real
``hpcrl.job.node`` processes and checks exit codes, messages, markers and that no Ray
process of the job is left afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.job.simulated import SimulatedJob, free_port_base, processes_of_job, wait_node

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def job(tmp_path, request) -> SimulatedJob:
    seed = os.getpid() + hash(request.node.name)
    simulated = SimulatedJob(run_dir=tmp_path / "run", num_nodes=2, port_base=free_port_base(seed))
    simulated.write_plan()
    yield simulated
    leftovers = processes_of_job(simulated)
    assert leftovers == [], "Ray processes left behind:\n" + "\n".join(leftovers)


def start_all(job: SimulatedJob, **env: str):
    started = time.monotonic()
    return started, [job.start_node(rank, **env) for rank in range(job.num_nodes)]


def test_two_nodes_join_and_the_probe_runs_work_on_each(job):
    started, nodes = start_all(job)
    head, worker = (wait_node(node, started) for node in nodes)

    assert (head.exit_code, worker.exit_code) == (0, 0), head.output + worker.output
    probe = json.loads((job.run_dir / "probe.json").read_text())
    assert probe["problems"] == []
    assert probe["num_alive_nodes"] == 2
    assert [task["rank"] for task in probe["tasks"]] == [0, 1]
    assert [task["value"] for task in probe["tasks"]] == [0, 1]
    assert len({task["node_id"] for task in probe["tasks"]}) == 2
    ready = json.loads((job.run_dir / "status" / "ray_ready").read_text())
    assert (ready["attempt"], ready["num_nodes"]) == (f"{job.job_id}.0", 2)
    done = json.loads((job.run_dir / "status" / "done").read_text())
    assert done["exit_code"] == 0
    for rank in (0, 1):
        node_log = (job.run_dir / "logs" / f"node{rank}" / "attempt0" / "node.log").read_text()
        assert f"node {rank} of 2 (localhost, 127.0.0.1), job {job.job_id}" in node_log
        assert "Ray stopped" in node_log
    assert "Ray ready: 2 nodes" in (job.run_dir / "logs/node0/attempt0/driver.log").read_text()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", job.gcs_port), timeout=1).close()


# Node 0 whose first `ray start` is a real head that never registers as rank 0 (its resource
# renamed) and then fails as Ray's 30 s start-up window does; the later start is the real one.
HEAD_MISSING_ITS_START_UP_WINDOW = """
import sys
import hpcrl.job.ray_cluster as ray_cluster
real_launch_argv, launches = ray_cluster.launch_argv, []
def launch_argv(settings, go_file):
    argv = real_launch_argv(settings, go_file)
    launches.append(argv)
    if len(launches) > 1:
        return argv
    unregistered = [arg.replace("hpcrl_node_0", "not_rank_0") for arg in argv]
    failing = ('"$@" & ray=$!; sleep 10; kill $ray; wait $ray; '
               'echo "Exception: The current node timed out during startup." >&2; exit 1')
    return ["sh", "-c", failing, "sh", *unregistered]
ray_cluster.launch_argv = launch_argv
from hpcrl.job.node import main
sys.exit(main(sys.argv[1]))
"""


def test_a_head_that_missed_rays_start_up_window_starts_again_with_its_driver(job):
    """CI, 2026-12-05: on a loaded machine node 0's raylet missed Ray's 30 s registration
    window and the attempt was lost. Before any worker is told to join, the head starts once
    more, and so does the driver: its GCS reader, connected to the first GCS, would abort on
    the new one (Ray's WrongClusterID check)."""
    started = time.monotonic()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-c", HEAD_MISSING_ITS_START_UP_WINDOW, str(job.run_dir)],
            env=job.node_env(0), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ),
        job.start_node(1),
    ]  # fmt: skip
    head, worker = (wait_node(node, started) for node in nodes)

    assert (head.exit_code, worker.exit_code) == (0, 0), head.output + worker.output
    probe = json.loads((job.run_dir / "probe.json").read_text())
    assert (probe["problems"], probe["num_alive_nodes"]) == ([], 2)
    logs = job.run_dir / "logs/node0/attempt0"
    node_log = (logs / "node.log").read_text()
    assert "missed its 30 s registration window (busy node?); starting the head again" in node_log
    assert "starting the driver again: the Ray head it waited for is a new one" in node_log
    assert node_log.count("started Ray head and driver") == 2
    assert (logs / "ray.err").read_text().count("timed out during startup") == 1
    assert "Ray ready: 2 nodes" in (logs / "driver.log").read_text()


def test_failing_driver_exit_code_reaches_the_job(job):
    started, nodes = start_all(job, HPCRL_DRIVER="tests.job.drivers:exit_with_7")
    head, worker = (wait_node(node, started) for node in nodes)

    assert head.exit_code == 7, head.output
    assert worker.exit_code == 0, worker.output
    assert json.loads((job.run_dir / "status" / "done").read_text())["exit_code"] == 7
    driver_log = (job.run_dir / "logs/node0/attempt0/driver.log").read_text()
    assert "driver: failing on purpose with exit code 7" in driver_log
    # Ray's own logs are kept next to the node's when the run failed.
    assert (job.run_dir / "logs/node0/attempt0/ray-session-logs").is_dir()


def test_submitit_entrypoint_raises_with_the_driver_exit_code(job):
    job.num_nodes = 1
    job.write_plan()  # a one-node job
    started = time.monotonic()
    head = wait_node(
        job.start_node(0, entry="NodeMain", HPCRL_DRIVER="tests.job.drivers:exit_with_7"), started
    )

    assert head.exit_code == 1
    assert "DriverFailed: driver tests.job.drivers:exit_with_7 exited with code 7" in head.output
    assert "driver: failing on purpose with exit code 7" in head.output  # the log tail


def test_worker_without_head_fails_within_its_deadline(job):
    started = time.monotonic()
    worker = wait_node(job.start_node(1, HPCRL_HEAD_WAIT_S="3"), started)

    assert worker.exit_code == 1
    assert f"head unreachable at 127.0.0.1:{job.gcs_port} after 3s" in worker.output
    assert worker.elapsed_s < 3 + 15  # the deadline, plus Python and imports on a busy machine
    failed = json.loads((job.run_dir / "status" / "node1.failed").read_text())
    assert failed["message"].startswith("head unreachable at 127.0.0.1")


def test_worker_never_joins_a_head_its_job_did_not_announce(job):
    with socket.socket() as foreign_head:  # another job's Ray on the same GCS port
        foreign_head.bind(("127.0.0.1", job.gcs_port))
        foreign_head.listen()
        started = time.monotonic()
        worker = wait_node(job.start_node(1, HPCRL_HEAD_WAIT_S="3"), started)

    assert worker.exit_code == 1
    assert f"head unreachable at 127.0.0.1:{job.gcs_port} after 3s" in worker.output
    assert "node 0 of this job never announced its head" in worker.output
    # `ray start` was held back until the head would be confirmed, so it never ran.
    assert (job.run_dir / "logs/node1/attempt0/ray.out").read_text() == ""


def test_port_in_use_is_named_and_the_worker_stops_early(job):
    busy_port = job.node_port(0, "object_manager_port")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", busy_port))
        squatter.listen()
        started, nodes = start_all(job, HPCRL_HEAD_WAIT_S="120")
        head, worker = (wait_node(node, started) for node in nodes)

    assert head.exit_code == 1
    assert (
        f"port {busy_port} already in use on node localhost (127.0.0.1; "
        "ray_ports.object_manager_port): held by pid "
        f"{os.getpid()} (" in head.output  # this test's process holds it
    )
    assert worker.exit_code == 1
    assert "node 0 (localhost) failed: port " in worker.output
    assert worker.elapsed_s < 60  # it did not sit out its 120 s deadline


def test_missing_node_is_named_after_the_join_deadline(job):
    started = time.monotonic()
    head = wait_node(job.start_node(0, HPCRL_JOIN_TIMEOUT_S="4"), started)

    assert head.exit_code == 1
    assert "only 1 of 2 nodes joined after 4s (missing: node 1 (localhost))" in head.output
    failed = json.loads((job.run_dir / "status" / "node0.failed").read_text())
    assert "only 1 of 2 nodes joined" in failed["message"]


def test_ray_and_driver_end_when_the_entrypoint_is_killed(job):
    """SIGKILL leaves no chance to clean up; local runs have no Slurm step to reap children."""
    job.num_nodes = 1
    job.write_plan()  # a one-node job
    node = job.start_node(0, HPCRL_DRIVER="tests.job.drivers:checkpoint_on_preempt")
    deadline = time.monotonic() + 120
    while not (job.run_dir / "driver_started").exists():
        assert time.monotonic() < deadline and node.poll() is None, "driver did not start"
        time.sleep(0.2)
    assert processes_of_job(job) != []

    node.kill()
    node.wait()

    deadline = time.monotonic() + 60
    while processes_of_job(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not Path(f"/tmp/hpcrl-ray-{job.job_id}-0").exists()
    # the fixture asserts that no process of the job is left
