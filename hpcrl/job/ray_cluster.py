"""Ray head/worker processes of one node: the ``ray start`` command, its start and its stop.

Every node runs ``ray start --block`` as a child it owns, bound to the node's own IP with the
profile's fixed ports (all below the OS ephemeral range), a per-node temp dir inside a folder
only the job's user can enter, no dashboard,
no usage stats, and the job's own token authentication (``hpcrl.job.ray_auth``). Workers always join an explicit ``--address``, never a cluster found
through ``/tmp/ray/ray_current_cluster``.

Two of Ray's start-up costs are switched off (``hpcrl.core.ray_startup``): the head's
autoscaler monitor (a Slurm allocation has a fixed set of nodes) and the idle workers Ray
prestarts for the first driver.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs

from hpcrl.core.ray_startup import NO_PRESTART_ENV
from hpcrl.job.errors import PortInUse, RayExited
from hpcrl.job.network import first_busy_port, port_holder
from hpcrl.job.processes import start_in_own_session, stop_session
from hpcrl.job.ray_auth import apply_ray_auth, make_private_ray_dir
from hpcrl.job.settings import NodeSettings
from hpcrl.run.markers import HEAD, node_log_dir, read_marker

# Ports every node binds, and those only the head binds (named as in RayPortsCfg).
NODE_PORT_NAMES = (
    "node_manager_port", "object_manager_port", "runtime_env_agent_port",
    "metrics_export_port", "dashboard_agent_grpc_port", "dashboard_agent_listen_port",
)  # fmt: skip
# The head runs a minimal dashboard process even with --include-dashboard=false, on dashboard_port.
HEAD_PORT_NAMES = ("gcs_port", "client_server_port", "dashboard_port")


def node_resource_name(node_rank: int) -> str:
    """A custom Ray resource (amount 1) that marks the node of this rank.

    Tasks pin to a node with ``resources={name: 0.001}``; the join check names missing
    nodes by rank even when simulated nodes share one IP.
    """
    return f"hpcrl_node_{node_rank}"


def ray_environment(base: Mapping[str, str], settings: NodeSettings) -> dict[str, str]:
    """The environment for Ray's processes (and the driver): quiet, quick to stop, and with
    the job's own token authentication (hpcrl.job.ray_auth)."""
    env = apply_ray_auth(base, settings)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray otherwise drains for 30 s on SIGTERM before it stops.
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    env.update(NO_PRESTART_ENV)
    env.pop("RAY_ADDRESS", None)  # a stale address must not leak into `ray start`
    return env


def ray_start_argv(settings: NodeSettings) -> list[str]:
    """``ray start`` for this node: the head on node 0, a worker joining it elsewhere."""
    ports = settings.ray_ports
    ray_cli = str(Path(sys.executable).with_name("ray"))
    argv = [ray_cli, "start", "--block", "--disable-usage-stats"]
    if settings.is_head:
        argv += ["--head", f"--port={ports.gcs_port}", "--include-dashboard=false"]
        argv += ["--no-monitor"]  # the autoscaler's: nodes come from Slurm, never from Ray
        argv += [f"--ray-client-server-port={ports.client_server_port}"]
        argv += [f"--dashboard-port={ports.dashboard_port}"]
    else:
        argv += [f"--address={settings.gcs_address}"]
    argv += [f"--node-ip-address={settings.node_ip}", f"--temp-dir={settings.ray_temp_dir}"]
    argv += [f"--{name.replace('_', '-')}={getattr(ports, name)}" for name in NODE_PORT_NAMES]
    argv += [f"--min-worker-port={ports.min_worker_port}"]
    argv += [f"--max-worker-port={ports.max_worker_port}"]
    argv += [f"--resources={json.dumps({node_resource_name(settings.node_rank): 1})}"]
    argv += [f"--num-gpus={settings.num_gpus}"]
    if settings.num_cpus is not None:
        argv += [f"--num-cpus={settings.num_cpus}"]
    if settings.object_store_mb is not None:
        argv += [f"--object-store-memory={settings.object_store_mb * 1024 * 1024}"]
    return argv


def launch_argv(settings: NodeSettings, go_file: str) -> list[str]:
    """``ray start`` for this node, through hpcrl.job.ray_launcher (imports first, then waits)."""
    max_wait_s = settings.head_wait_s + 60  # the entrypoint gives up at head_wait_s
    ray_args = ray_start_argv(settings)[1:]
    return [
        sys.executable,
        "-m",
        "hpcrl.job.ray_launcher",
        go_file,
        str(max_wait_s),
        settings.ray_private_dir,
        "--",
        *ray_args,
    ]


def ports_to_check(settings: NodeSettings) -> list[tuple[str, int]]:
    names = NODE_PORT_NAMES + (HEAD_PORT_NAMES if settings.is_head else ())
    return [(name, getattr(settings.ray_ports, name)) for name in names]


# `ray start` gives its raylet a hard-coded 30 s to register with the GCS; on an overloaded
# node that can pass although nothing is wrong. A worker then starts Ray once more. So does the
# head while no worker has been told to join (the driver writes the ``head`` marker only once
# node 0's raylet registered): a new GCS on the same port is then a new cluster nobody is in
# yet, and the driver's node-table reader reconnects to it (CI, 2026-12-05: a head that missed
# the window on a loaded 2-core machine cost the attempt).
STARTUP_TIMEOUT_TEXT = "timed out during startup"
MAX_STARTUP_RETRIES = 1


@attrs.define
class RayNode:
    """This node's running ``ray start --block``; ``stop`` leaves no process behind."""

    settings: NodeSettings
    environ: Mapping[str, str]
    process: subprocess.Popen[bytes] | None = None
    startup_retries: int = 0
    failed: bool = False  # set when this node reported a failure: keep Ray's logs

    @classmethod
    def start(cls, settings: NodeSettings, environ: Mapping[str, str], *, hold: bool) -> RayNode:
        """Check the fixed ports are free (PortInUse names a busy one), then start Ray.

        ``hold``: Ray's imports run now, ``ray start`` itself only after ``release()`` (a
        worker starts this while it still waits for the head).
        """
        busy = first_busy_port(settings.node_ip, ports_to_check(settings))
        if busy is not None:
            name, port = busy
            holder = port_holder(settings.node_ip, port)
            raise PortInUse(port, name, settings.task.node_name, settings.node_ip, holder)
        node = cls(settings=settings, environ=environ)
        node._launch(str(node.go_file) if hold else "-")
        return node

    @property
    def log_dir(self) -> Path:
        return node_log_dir(
            self.settings.run_dir, self.settings.node_rank, self.settings.task.run_attempt
        )

    @property
    def go_file(self) -> Path:
        return Path(self.settings.ray_private_dir) / "go"

    def release(self) -> None:
        """Let a held ``ray start`` run."""
        self.go_file.touch()

    def _launch(self, go_file: str) -> None:
        make_private_ray_dir(self.settings)  # empty: an earlier crash's files are gone
        self.process = start_in_own_session(
            launch_argv(self.settings, go_file), env=ray_environment(self.environ, self.settings),
            stdout_path=self.log_dir / "ray.out", stderr_path=self.log_dir / "ray.err",
        )  # fmt: skip

    def check_alive(self) -> bool:
        """Raise RayExited when ``ray start --block`` has ended on its own; True when it ended
        by missing Ray's start-up window and was started again (once)."""
        process = self.process
        assert process is not None, "RayNode.start launches Ray before anything checks it"
        code = process.poll()
        if code is None:
            return False
        error_tail = tail(self.log_dir / "ray.err")
        if self._may_start_again(error_tail):
            logging.getLogger("hpcrl.job").warning(
                "Ray's raylet missed its 30 s registration window (busy node?); starting %s again",
                "the head" if self.settings.is_head else "it",
            )
            stop_session(process, self.settings.stop_timeout_s)
            self.startup_retries += 1
            self._launch("-")
            return True
        detail = f"its Ray exited ({ray_exit_detail(self.log_dir) or f'code {code}'})"
        raise RayExited(
            f"Ray on node {self.settings.task.node_name} exited with code {code} while the "
            f"job still needed it ({detail}); see {self.log_dir}/ray.out and ray.err:\n"
            f"{error_tail}",
            detail=detail,
            log=str((self.log_dir / "ray.out").relative_to(self.settings.run_dir)),
        )

    def _may_start_again(self, error_tail: str) -> bool:
        if self.startup_retries >= MAX_STARTUP_RETRIES or STARTUP_TIMEOUT_TEXT not in error_tail:
            return False
        if not self.settings.is_head:
            return True
        task = self.settings.task
        return read_marker(self.settings.run_dir, HEAD, task.attempt_id) is None

    def stop(self, keep_ray_logs: bool) -> list[str]:
        """Stop every Ray process of this node; returns the names that needed SIGKILL."""
        killed = stop_session(self.process, self.settings.stop_timeout_s) if self.process else []
        temp_dir = Path(self.settings.ray_temp_dir)
        if keep_ray_logs:
            # Ray's own logs (raylet.out, gcs_server.out, ...) live in the temp dir; keep them
            # next to the node's logs when something went wrong.
            session_logs = temp_dir / "session_latest" / "logs"
            if session_logs.is_dir():
                shutil.copytree(session_logs, self.log_dir / "ray-session-logs", dirs_exist_ok=True,
                                ignore_dangling_symlinks=True)  # fmt: skip
        shutil.rmtree(self.settings.ray_private_dir, ignore_errors=True)
        return killed


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_EXITED_PROCESS = re.compile(r"(?P<name>[\w.-]+) \[exit code=(?P<code>-?\d+)\]")
_EXITED_HEADER = "Some Ray subprocesses exited unexpectedly:"


def ray_exit_detail(log_dir: Path) -> str:
    """Which of Ray's processes ended ``ray start --block`` and how (``raylet killed by signal
    9``), from what it printed to ray.out before exiting; '' when it said nothing."""
    # Ray prints its report, then up to a few hundred lines of the process's own log.
    text = _ANSI_ESCAPE.sub("", tail(log_dir / "ray.out", num_lines=1 << 20, max_bytes=1 << 20))
    _, header, after = text.rpartition(_EXITED_HEADER)
    if not header:
        return ""
    exited = []
    for line in after.splitlines()[1:]:
        match = _EXITED_PROCESS.search(line)
        if match is None:
            break
        code = int(match["code"])
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        exited.append(f"{match['name']} {how}")
    return ", ".join(exited)


def tail(path: Path, num_lines: int = 20, max_bytes: int = 16384) -> str:
    """The last lines of a text file ('' when it does not exist)."""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - max_bytes))
            lines = file.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-num_lines:])
