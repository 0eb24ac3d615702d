"""Node settings, Slurm host lists, the `ray start` command and the requeue hook (no Ray started)."""

from __future__ import annotations

import json
import pickle

import pytest
from submitit.helpers import DelayedSubmission

import hpcrl
from hpcrl.config.profile import RayPortsCfg, SlurmCfg
from hpcrl.job.errors import NodeSettingsError
from hpcrl.job.node import NodeMain
from hpcrl.job.ray_cluster import ray_environment, ray_start_argv
from hpcrl.job.settings import read_node_settings
from hpcrl.job.slurm_env import expand_hostlist
from hpcrl.run.causes import read_cause
from hpcrl.run.jobspec_file import JOBSPEC_FILE
from hpcrl.run.markers import PREEMPT_FILE
from tests.job.plans import write_node_plan


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("n1,n2", ["n1", "n2"]),
        ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
        ("eos[0098-0100]-ib", ["eos0098-ib", "eos0099-ib", "eos0100-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


def slurm_env(rank: int, **extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "4242", "SLURM_NODEID": str(rank), "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "localhost,localhost", "SLURMD_NODENAME": "localhost", **extra,
    }  # fmt: skip


@pytest.fixture
def two_node_plan(tmp_path):
    """A 2-node CPU plan in tmp_path, as `hpcrl submit` leaves it for the job."""
    return write_node_plan(tmp_path, num_nodes=2)


def test_environment_overrides_the_plan_which_overrides_defaults(tmp_path):
    slurm = SlurmCfg(account="acct", partition="batch", max_requeues=3)
    ports = RayPortsCfg(gcs_port=7000, node_manager_port=7001)
    write_node_plan(tmp_path, num_nodes=2, gpu=True, slurm=slurm, ray_ports=ports)

    settings = read_node_settings(
        tmp_path, slurm_env(1, HPCRL_RAY_GCS_PORT="7100", SLURM_RESTART_COUNT="2")
    )

    assert settings.ray_ports.gcs_port == 7100  # env
    assert settings.ray_ports.node_manager_port == 7001  # the plan
    assert settings.ray_ports.object_manager_port == 19220  # job 4242's band: 4242 % 44 = 18
    # The plan's requeues, GPUs (device gpu: 8 per node), CPUs and node count.
    assert (settings.max_requeues, settings.num_gpus, settings.num_cpus) == (3, 8, 112)
    assert settings.num_nodes == 2
    assert (settings.node_rank, settings.is_head) == (1, False)
    assert (settings.node_ip, settings.head_ip) == ("127.0.0.1", "127.0.0.1")
    assert settings.task.attempt_id == "4242.2"
    assert settings.ray_temp_dir == "/tmp/hpcrl-ray-4242-1/ray"  # in a private folder per node


def test_a_cpu_plan_gives_ray_no_gpus_and_the_environment_can_override(tmp_path):
    write_node_plan(tmp_path, num_nodes=2)
    assert read_node_settings(tmp_path, slurm_env(0)).num_gpus == 0
    assert read_node_settings(tmp_path, slurm_env(0, HPCRL_RAY_NUM_GPUS="1")).num_gpus == 1


def test_without_slurm_one_local_node(tmp_path):
    write_node_plan(tmp_path, num_nodes=1)
    settings = read_node_settings(tmp_path, {"SUBMITIT_LOCAL_JOB_ID": "977"}, requeue_count=2)
    assert (settings.num_nodes, settings.node_rank, settings.node_ip) == (1, 0, "127.0.0.1")
    assert (settings.task.attempt_id, settings.ray_temp_dir) == (
        "local977.2",
        "/tmp/hpcrl-ray-local977-0/ray",
    )


def test_node_count_mismatch_names_both_counts(tmp_path):
    write_node_plan(tmp_path, num_nodes=4)
    with pytest.raises(NodeSettingsError, match="the plan expects 4 nodes but Slurm started 2"):
        read_node_settings(tmp_path, slurm_env(0))


def test_a_job_without_its_plan_stops_with_the_file_and_the_fix(tmp_path):
    with pytest.raises(NodeSettingsError) as caught:
        read_node_settings(tmp_path, slurm_env(0))
    assert str(caught.value).startswith(f"{tmp_path / JOBSPEC_FILE} does not exist")
    assert "submit the recipe again with this hpcrl" in str(caught.value)


def test_a_plan_from_another_hpcrl_stops_the_job_with_the_resubmit_command(tmp_path):
    spec = write_node_plan(tmp_path, num_nodes=2)
    path = tmp_path / JOBSPEC_FILE
    record = json.loads(path.read_text())
    path.write_text(json.dumps(record | {"hpcrl_version": "0.0.1"}))
    with pytest.raises(NodeSettingsError) as caught:
        read_node_settings(tmp_path, slurm_env(0))
    message = str(caught.value)
    assert message.startswith(
        f"{path} was written by hpcrl 0.0.1, but this job runs hpcrl {hpcrl.__version__}"
    )
    assert f"hpcrl submit {spec.recipe_source} --cluster plain" in message


def test_distinct_hosts_on_loopback_are_refused(tmp_path, two_node_plan):
    env = slurm_env(0, SLURM_JOB_NODELIST="n1,n2", SLURMD_NODENAME="n1", HPCRL_NODE_IP="127.0.1.1")
    with pytest.raises(NodeSettingsError, match="resolves to the loopback address 127.0.1.1"):
        read_node_settings(tmp_path, env)


def test_bad_env_value_names_the_variable(tmp_path, two_node_plan):
    with pytest.raises(NodeSettingsError, match="HPCRL_JOIN_TIMEOUT_S='soon' is not a valid float"):
        read_node_settings(tmp_path, slurm_env(0, HPCRL_JOIN_TIMEOUT_S="soon"))


def test_ray_start_command_for_head_and_worker(tmp_path, two_node_plan):
    head = read_node_settings(tmp_path, slurm_env(0, HPCRL_RAY_NUM_CPUS="4"))
    worker = read_node_settings(tmp_path, slurm_env(1))

    head_argv, worker_argv = ray_start_argv(head), ray_start_argv(worker)

    # Job 4242 takes band 4242 % 44 = 18: ports 19216..19727.
    assert head_argv[1:6] == ["start", "--block", "--disable-usage-stats", "--head", "--port=19216"]
    for flag in ("--include-dashboard=false", "--ray-client-server-port=19217",
                 "--dashboard-port=19218", "--node-ip-address=127.0.0.1",
                 "--temp-dir=/tmp/hpcrl-ray-4242-0/ray", "--node-manager-port=19219",
                 "--object-manager-port=19220", "--runtime-env-agent-port=19221",
                 "--metrics-export-port=19222", "--dashboard-agent-grpc-port=19223",
                 "--dashboard-agent-listen-port=19224", "--min-worker-port=19232",
                 "--max-worker-port=19727", '--resources={"hpcrl_node_0": 1}',
                 "--num-gpus=0", "--num-cpus=4"):  # fmt: skip
        assert flag in head_argv
    assert "--no-monitor" in head_argv  # no autoscaler: Slurm gives the nodes
    assert "--address=127.0.0.1:19216" in worker_argv
    assert not any(
        arg.startswith(("--head", "--port", "--include-dashboard", "--no-monitor"))
        for arg in worker_argv
    )
    assert '--resources={"hpcrl_node_1": 1}' in worker_argv


def test_ray_environment_is_explicit_and_drops_a_stale_address(tmp_path, two_node_plan):
    settings = read_node_settings(tmp_path, slurm_env(0))
    env = ray_environment({"RAY_ADDRESS": "10.0.0.9:6379", "PATH": "/bin"}, settings)
    assert "RAY_ADDRESS" not in env
    assert env["PATH"] == "/bin"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert env["RAY_prestart_worker_first_driver"] == "0"  # no idle workers nobody asked for
    assert env["RAY_AUTH_MODE"] == "token"  # tests/job/test_ray_auth.py has the rest


def test_checkpoint_writes_preempt_and_requeues_until_the_limit(
    tmp_path, monkeypatch, two_node_plan
):
    for name, value in slurm_env(0, HPCRL_MAX_REQUEUES="2", SLURM_RESTART_COUNT="1").items():
        monkeypatch.setenv(name, value)
    entry = NodeMain()
    entry.num_requeues = 1

    resubmission = entry.checkpoint(str(tmp_path))

    assert (tmp_path / PREEMPT_FILE).read_text() == "4242.1"
    assert isinstance(resubmission, DelayedSubmission)
    assert resubmission.args == (str(tmp_path),)
    requeued = pickle.loads(pickle.dumps(resubmission.function))
    assert isinstance(requeued, NodeMain) and requeued.num_requeues == 2
    # the attempt's end is recorded for status and --wait (no driver ran here to save)
    assert read_cause(tmp_path, 1).titled_line() == (
        "attempt 2: preempted (USR2: time limit or preemption): no checkpoint confirmed; "
        "requeued, the next attempt resumes from the last checkpoint "
        "(log: logs/node0/attempt1/node.log)"
    )
    assert requeued.checkpoint(str(tmp_path)) is None  # 2 of 2 used: submitit stops requeueing
    assert not read_cause(tmp_path, 1).requeued


@pytest.mark.parametrize(
    ("rank", "workers_told_to_join", "restarts"),
    [(1, True, 1), (0, False, 1), (0, True, 0)],
    ids=["worker", "head-before-anyone-joined", "head-after-workers-were-told-to-join"],
)
def test_ray_starts_once_more_after_a_startup_timeout_unless_it_is_a_head_others_joined(
    tmp_path, monkeypatch, two_node_plan, rank, workers_told_to_join, restarts
):
    """`ray start` is replaced by a stand-in that fails the way an overloaded raylet does. A
    head may start again only while the driver has not yet announced it to the workers (the
    ``head`` marker): their raylets would be in the GCS that a restart replaces."""
    import hpcrl.job.ray_cluster as ray_cluster
    from hpcrl.job.errors import RayExited
    from hpcrl.run.markers import HEAD, write_marker

    failing = [
        "sh",
        "-c",
        "echo 'Exception: The current node timed out during startup.' >&2; exit 1",
    ]
    monkeypatch.setattr(ray_cluster, "launch_argv", lambda settings, go_file: failing)
    monkeypatch.setattr(ray_cluster, "first_busy_port", lambda ip, ports: None)
    settings = read_node_settings(tmp_path, slurm_env(rank))
    if workers_told_to_join:
        write_marker(tmp_path, HEAD, settings.task.attempt_id, ip="127.0.0.1", gcs_port=1)
    node = ray_cluster.RayNode.start(settings, {}, hold=False)

    for _ in range(restarts):
        node.process.wait()
        node.check_alive()  # a failure within the window: started again
    assert node.startup_retries == restarts
    node.process.wait()
    with pytest.raises(RayExited, match="Ray on node localhost exited with code 1"):
        node.check_alive()
    node.stop(keep_ray_logs=False)
    ray_err = (tmp_path / f"logs/node{rank}/attempt0/ray.err").read_text()
    assert ray_err.count("timed out during startup") == restarts + 1


def test_the_ray_launcher_waits_for_go_and_gives_up_without_it(tmp_path, monkeypatch):
    import threading

    from hpcrl.job import ray_launcher

    go = tmp_path / "go"
    threading.Timer(0.2, go.touch).start()
    assert ray_launcher.wait_for_go(str(go), 30) is True
    assert ray_launcher.wait_for_go(str(tmp_path / "never"), 0.2) is False
    parents = iter([41, 1])  # the parent dies: the process is re-parented
    monkeypatch.setattr(ray_launcher.os, "getppid", lambda: next(parents, 1))
    assert ray_launcher.wait_for_go(str(tmp_path / "never"), 30) is False


HOLD_A_PORT = """
import socket, sys, time  # hpcrl test: a port holder
holder = socket.socket()
holder.bind((sys.argv[1], 0))
holder.listen()
print(holder.getsockname()[1], flush=True)
time.sleep(120)
"""


def test_a_busy_port_names_the_process_holding_it(tmp_path, monkeypatch, two_node_plan):
    """A child process listens on a port the node needs: the error names its pid and command
    (CI once failed on a busy port whose holder nobody could tell afterwards)."""
    import subprocess
    import sys

    import hpcrl.job.ray_cluster as ray_cluster
    from hpcrl.job.errors import PortInUse

    settings = read_node_settings(tmp_path, slurm_env(0))
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_PORT, settings.node_ip], stdout=subprocess.PIPE, text=True
    )
    try:
        busy_port = int(child.stdout.readline())
        # Only the child's port is checked: the plan's fixed ports may be another test's now.
        monkeypatch.setattr(
            ray_cluster, "ports_to_check", lambda settings: [("client_server_port", busy_port)]
        )
        with pytest.raises(PortInUse) as raised:
            ray_cluster.RayNode.start(settings, {}, hold=False)
    finally:
        child.kill()
        child.wait()
    message = str(raised.value)
    assert message.startswith(
        f"port {busy_port} already in use on node localhost ({settings.node_ip}; "
        f"ray_ports.client_server_port): held by pid {child.pid} ("
    ), message
    assert "-c import socket, sys, time # hpcrl test: a port holder" in message, message
    assert raised.value.holder.startswith(f"pid {child.pid} (python")
    assert len(raised.value.holder) < 200  # the command line is cut short


def test_a_port_holder_nobody_may_see_is_said_to_be_unknown(monkeypatch):
    """Another user's socket is listed without its process (psutil gives no pid)."""
    from types import SimpleNamespace

    import psutil

    from hpcrl.job.network import UNKNOWN_HOLDER, port_holder

    address = SimpleNamespace(ip="127.0.0.1", port=10001)
    hidden = SimpleNamespace(laddr=address, status=psutil.CONN_LISTEN, pid=None)
    monkeypatch.setattr(psutil, "net_connections", lambda kind: [hidden])
    assert port_holder("127.0.0.1", 10001) == UNKNOWN_HOLDER
