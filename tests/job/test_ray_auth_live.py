"""A running job's Ray admits its own driver and workers, and refuses everyone else.

Two simulated nodes (tests/job/simulated.py: real ``hpcrl.job.node`` processes with real Ray on
loopback) run the probe driver and then hold the job open (``tests.job.drivers:probe_then_hold``).
Meanwhile a separate process that knows the head's address but not the token tries to connect,
and the same process with the token (as a control: the port is open and the cluster answers)
connects and runs a task. Every port the job's Ray processes listen on is knocked on without
the token. The last test does the same on the real 2-node Slurm test cluster.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.job import ray_listeners
from tests.job.plans import write_node_plan
from tests.job.simulated import (
    NODE_PORT_FIELDS,
    REPO_ROOT,
    SimulatedJob,
    free_port_base,
    processes_of_job,
    wait_node,
)
from tests.slurm.harness import (
    NETNS_NODE_IPS,
    cluster_mode,
    run_slurm,
    wait_job_gone_from_queue,
    wait_sacct_states,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
AUTH_REFUSED = "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken"


def intruder_env(home: Path, token_file: Path | None = None) -> dict[str, str]:
    """A clean shell of the same user: no Ray or hpcrl variables, an empty home (no
    ~/.ray/auth_token), and the job's token only when ``token_file`` is given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HPCRL_", "SLURM_"))}
    env |= {"HOME": str(home), "PYTHONPATH": str(REPO_ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    if token_file is not None:
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    return env


def intrude(env: dict[str, str], *args: str, prefix: tuple[str, ...] = ()) -> dict:
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "tests.job.ray_intruder", *args],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_for(path: Path, nodes, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        ended = [node.poll() for node in nodes if node.poll() is not None]
        assert not ended, f"a node exited ({ended}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.3)


def files_holding(folder: Path, text: str) -> list[str]:
    """Regular files under ``folder`` that contain ``text`` (sockets and links skipped)."""
    found = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes():
                found.append(str(path.relative_to(folder)))
        except FileNotFoundError:  # a file Ray removed meanwhile
            continue
    return sorted(found)


@pytest.fixture
def job(tmp_path, request):
    seed = os.getpid() + hash(request.node.name)
    simulated = SimulatedJob(run_dir=tmp_path / "run", num_nodes=2, port_base=free_port_base(seed))
    simulated.write_plan()  # as `hpcrl submit` leaves it, less the token: node 0 makes that
    yield simulated
    (simulated.run_dir / "release").touch()
    leftovers = processes_of_job(simulated)
    assert leftovers == [], "Ray processes left behind:\n" + "\n".join(leftovers)


def test_a_running_job_refuses_a_caller_without_its_token(job, tmp_path):
    started = time.monotonic()
    nodes = [
        job.start_node(rank, HPCRL_DRIVER="tests.job.drivers:probe_then_hold") for rank in (0, 1)
    ]
    try:
        wait_for(job.run_dir / "driver_holding", nodes)
        # The job's own driver ran a task on each node and an actor on node 1, with the token.
        holding = json.loads((job.run_dir / "driver_holding").read_text())
        assert holding == {"probe_code": 0, "actor": "pong"}
        token_file = job.run_dir / "auth" / "ray_token"  # node 0 made it: no run folder writer
        token = token_file.read_text().strip()
        for rank in (0, 1):  # Ray's sockets and logs: only the job's user may enter
            node_dir = Path(f"/tmp/hpcrl-ray-{job.job_id}-{rank}")
            assert stat.S_IMODE(node_dir.stat().st_mode) == 0o700
            assert stat.S_IMODE((node_dir / "ray").stat().st_mode) == 0o777  # Ray's own choice
            assert files_holding(node_dir, token) == []  # Ray's own logs and session files
        address = f"127.0.0.1:{job.gcs_port}"
        home = tmp_path / "home"
        home.mkdir()

        without = intrude(intruder_env(home), "init", address, "127.0.0.1")
        assert without["connected"] is False
        assert without["errors"][0].startswith("builtins.ConnectionError: Failed to connect")
        assert any(AUTH_REFUSED in error for error in without["errors"]), without
        gcs_without = intrude(intruder_env(home), "gcs", address)
        assert gcs_without["connected"] is False
        assert gcs_without["errors"][0].startswith(AUTH_REFUSED)
        wrong = tmp_path / "wrong_token"
        wrong.write_text("0" * 64 + "\n")
        gcs_wrong = intrude(intruder_env(home, wrong), "gcs", address)
        assert gcs_wrong["errors"][0].startswith(AUTH_REFUSED)

        # Control: the same process with the token reaches the same port and runs work.
        assert intrude(intruder_env(home, token_file), "gcs", address) == {
            "connected": True, "num_nodes": 2,
        }  # fmt: skip
        with_token = intrude(intruder_env(home, token_file), "init", address, "127.0.0.1")
        assert with_token == {"connected": True, "num_nodes": 2, "task_result": 49}
        assert not (home / ".ray").exists()  # nothing fell back to ~/.ray/auth_token

        listeners = ray_listeners.listening_ports(
            ray_listeners.job_processes(psutil.Process(node.pid) for node in nodes)
        )
        answers = ray_listeners.knock_every_listener(
            listeners, simulated_port_kinds(job), "127.0.0.1", token
        )
        print(json.dumps(answers, indent=1))
        assert set(answers) == EXPECTED_KINDS, answers
    finally:
        (job.run_dir / "release").touch()
        head, worker = (wait_node(node, started) for node in nodes)
    assert (head.exit_code, worker.exit_code) == (0, 0), head.output + worker.output
    assert_token_stays_private(job.run_dir, token_file)


# Everything a 2-node job's Ray listens on while a driver and an actor run (no dashboard).
EXPECTED_KINDS = {
    "gcs", "raylet", "object_manager", "worker", "client_server", "runtime_env_agent",
    "dashboard_agent_grpc", "dashboard_agent_http", "metrics",
}  # fmt: skip


def simulated_port_kinds(job: SimulatedJob) -> dict[int, str]:
    """Simulated nodes share one IP, so each rank has ports of its own (tests/job/simulated.py)."""
    kinds = {}
    for rank in range(job.num_nodes):
        env = job.node_env(rank)
        named = {
            field: int(env[f"HPCRL_RAY_{field.upper()}"]) for field in ray_listeners.PORT_KINDS
        }
        kinds |= ray_listeners.port_kinds(
            named, int(env["HPCRL_RAY_MIN_WORKER_PORT"]), int(env["HPCRL_RAY_MAX_WORKER_PORT"])
        )
    return kinds


def assert_token_stays_private(run_dir: Path, token_file: Path) -> None:
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) == 64
    # Not in jobspec, markers, logs (Ray's own session logs included when kept), probe output.
    assert files_holding(run_dir, token) == ["auth/ray_token"]


# --------------------------------------------------------------------------- real Slurm
PROBE_SCRIPT = Path(__file__).with_name("two_node_probe.sbatch")


@pytest.mark.slurm
def test_a_running_slurm_job_refuses_a_caller_without_its_token(tmp_path):
    """Both nodes of the test cluster run the job (node entrypoints started by srun, the token
    made by node 0); this machine, outside the nodes' network namespaces, knows the head's
    address and GCS port."""
    run_dir = tmp_path / "run"
    write_node_plan(run_dir, num_nodes=2)  # the plan only: node 0 makes the token
    job_id = run_slurm(
        "sbatch", "--parsable", f"--chdir={REPO_ROOT}", f"--output={run_dir}/slurm-%j.out",
        "--export=ALL,HPCRL_DRIVER=tests.job.drivers:probe_then_hold",
        str(PROBE_SCRIPT), str(run_dir), sys.executable,
    ).strip()  # fmt: skip
    netns = cluster_mode() == "netns"
    node_ips = [NETNS_NODE_IPS["n1"], NETNS_NODE_IPS["n2"]] if netns else ["127.0.0.1"] * 2
    here_ip = "10.77.0.1" if netns else "127.0.0.1"  # the bridge: this machine, not a node
    base = 20000 + (int(job_id) % 40) * 200  # two_node_probe.sbatch's port plan
    address = f"{node_ips[0]}:{base}"
    token_file = run_dir / "auth" / "ray_token"
    home = tmp_path / "home"
    home.mkdir()
    try:
        wait_for_slurm_file(run_dir / "driver_holding", job_id, timeout_s=420)
        assert json.loads((run_dir / "driver_holding").read_text()) == {
            "probe_code": 0, "actor": "pong",
        }  # fmt: skip

        without = intrude(intruder_env(home), "init", address, here_ip)
        assert without["connected"] is False
        assert without["errors"][0].startswith("builtins.ConnectionError: Failed to connect")
        assert any(AUTH_REFUSED in error for error in without["errors"]), without
        assert intrude(intruder_env(home), "gcs", address)["errors"][0].startswith(AUTH_REFUSED)
        assert intrude(intruder_env(home, token_file), "gcs", address) == {
            "connected": True, "num_nodes": 2,
        }  # fmt: skip
        # A driver must run on a node of the cluster: the control joins from node 0's network.
        on_node0 = ("nsenter", "--net=/run/netns/n1") if netns else ()
        with_token = intrude(
            intruder_env(home, token_file), "init", address, node_ips[0], prefix=on_node0
        )
        assert with_token == {"connected": True, "num_nodes": 2, "task_result": 49}

        token = token_file.read_text().strip()
        ports = {"gcs_port": base, "client_server_port": base + 1, "dashboard_port": base + 2}
        for offset, field in enumerate(NODE_PORT_FIELDS):
            ports[field] = base + 10 + offset
        kinds = ray_listeners.port_kinds(ports, base + 100, base + 199)
        answers = {}
        for rank, node_ip in enumerate(node_ips):
            listeners = ray_listeners.listening_ports(slurm_node_processes(job_id, rank, run_dir))
            answers |= ray_listeners.knock_every_listener(listeners, kinds, node_ip, token)
        assert set(answers) == EXPECTED_KINDS, answers
    finally:
        (run_dir / "release").touch()
        wait_job_gone_from_queue(job_id, timeout_s=240)
    wait_sacct_states(job_id, ["COMPLETED"])
    assert json.loads((run_dir / "probe.json").read_text())["problems"] == []
    assert_token_stays_private(run_dir, token_file)


def wait_for_slurm_file(path: Path, job_id: str, timeout_s: float) -> None:
    """Wait for ``path``; the job may queue behind other helpers' jobs meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        state = run_slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()
        assert state, f"job {job_id} left the queue before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path.name} not there after {timeout_s} s ({state})"
        time.sleep(0.5)


def slurm_node_processes(job_id: str, rank: int, run_dir: Path) -> list[psutil.Process]:
    """Node ``rank``'s Ray processes (their command lines name the node's Ray temp dir) and
    everything they started; on node 0 also the driver process (it names the run folder)."""
    marker = f"hpcrl-ray-{job_id}-{rank}"
    roots = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        is_driver = rank == 0 and "hpcrl.job.driver_process" in cmdline and str(run_dir) in cmdline
        if marker in cmdline or is_driver:
            roots.append(process)
    return ray_listeners.job_processes(roots)
