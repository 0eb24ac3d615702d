"""``NodeSettings``: everything one node's bootstrap needs, read in one place.

Sources, later ones win: built-in defaults < the planner's typed ``JobSpec`` (read from
``<run_dir>/jobspec.json`` by ``hpcrl.run.jobspec_file.read_jobspec``: node count, Ray
ports, requeues, GPUs or CPUs per node, ``ray_auth``) < ``HPCRL_*`` environment variables
(tests set them per simulated node; a site may set them in the profile's env). A job without a usable
jobspec.json stops here with the file and the fix. Slurm's own variables give the node's
rank and the job's hosts. Ray ports the plan and the environment leave unset come from the
job's port band.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.port_bands import BAND_VARIABLE, NUM_BANDS, job_key, job_ports
from hpcrl.config.profile import RayPortsCfg
from hpcrl.job.errors import NodeSettingsError
from hpcrl.job.slurm_env import SlurmTask, read_slurm_task
from hpcrl.run.jobspec import JobSpec
from hpcrl.run.jobspec_file import JobSpecError, read_jobspec

DEFAULT_DRIVER = "hpcrl.core.driver:run_training"
DRIVER_VARIABLE = "HPCRL_DRIVER"
RAY_AUTH_MODES = ("token", "none")  # the profile's ray_auth (JobSpec.ray_auth)
# The driver process reads the training group's master port from here (an override too).
TORCH_MASTER_PORT_VARIABLE = "HPCRL_RAY_TORCH_MASTER_PORT"

# HPCRL_* variable -> (setting name, type). Ray ports: HPCRL_RAY_<FIELD>, e.g. HPCRL_RAY_GCS_PORT.
_ENV_SETTINGS: dict[str, tuple[str, type]] = {
    "HPCRL_NUM_NODES": ("num_nodes", int),
    DRIVER_VARIABLE: ("driver", str),
    "HPCRL_MAX_REQUEUES": ("max_requeues", int),
    "HPCRL_NODE_IP": ("node_ip", str),
    "HPCRL_RAY_NUM_CPUS": ("num_cpus", int),
    "HPCRL_RAY_NUM_GPUS": ("num_gpus", int),
    "HPCRL_RAY_OBJECT_STORE_MB": ("object_store_mb", int),
    "HPCRL_RAY_TEMP_ROOT": ("ray_temp_root", str),
    "HPCRL_HEAD_START_S": ("head_start_s", float),
    "HPCRL_HEAD_WAIT_S": ("head_wait_s", float),
    "HPCRL_JOIN_TIMEOUT_S": ("join_timeout_s", float),
    "HPCRL_STOP_TIMEOUT_S": ("stop_timeout_s", float),
    "HPCRL_PREEMPT_GRACE_S": ("preempt_grace_s", float),
}


@attrs.frozen(kw_only=True)
class NodeSettings:
    """One node's bootstrap settings (see the module docstring for where each comes from)."""

    run_dir: Path
    task: SlurmTask
    num_nodes: int
    node_ip: str
    head_ip: str
    ray_ports: RayPortsCfg
    driver: str = DEFAULT_DRIVER  # "module:function", called on node 0 once all nodes joined
    max_requeues: int = 0
    num_cpus: int | None = None  # None: Ray counts the node's CPUs
    num_gpus: int = 0
    object_store_mb: int | None = None  # None: Ray's default share of memory
    ray_temp_root: str = "/tmp"  # Ray's unix socket paths must stay short
    head_start_s: float = 120.0  # node 0: its head's GCS port opens, then its raylet registers
    head_wait_s: float = 120.0  # workers: the head's GCS port must open within this
    join_timeout_s: float = 120.0  # node 0: then every other node registered within this
    stop_timeout_s: float = 20.0  # Ray's processes exit within this after SIGTERM, else SIGKILL
    preempt_grace_s: float = 60.0  # on USR2: how long the driver gets to checkpoint
    ray_auth: str = attrs.field(default="token", validator=attrs.validators.in_(RAY_AUTH_MODES))

    @property
    def node_rank(self) -> int:
        return self.task.node_rank

    @property
    def is_head(self) -> bool:
        return self.task.node_rank == 0

    @property
    def gcs_port(self) -> int:
        port = self.ray_ports.gcs_port
        assert port is not None, "read_node_settings gives every port (the job's band)"
        return port

    @property
    def gcs_address(self) -> str:
        return f"{self.head_ip}:{self.gcs_port}"

    @property
    def ray_private_dir(self) -> str:
        # Per job and node: simulated nodes share /tmp, and so may two jobs on one node.
        return f"{self.ray_temp_root}/hpcrl-ray-{self.task.job_id}-{self.task.node_rank}"

    @property
    def ray_temp_dir(self) -> str:
        # Ray makes every folder it creates writable by everyone, the one of its unix sockets
        # included; inside ray_private_dir (0700) other users of the node cannot reach them.
        return f"{self.ray_private_dir}/ray"


def resolve_ip(host_name: str) -> str:
    """The IPv4 address a host name resolves to here (/etc/hosts or DNS, as getent sees it)."""
    try:
        infos = socket.getaddrinfo(host_name, None, socket.AF_INET, socket.SOCK_STREAM)
        return str(infos[0][4][0])  # AF_INET: the address is (host, port)
    except socket.gaierror as error:
        raise NodeSettingsError(
            f"cannot resolve node name {host_name!r} to an IPv4 address ({error}); make node "
            "names resolvable on the nodes or set HPCRL_NODE_IP in the cluster profile's env"
        ) from None


def read_node_settings(
    run_dir: str | os.PathLike[str], environ: Mapping[str, str], requeue_count: int = 0
) -> NodeSettings:
    """Settings for this node from the run folder, Slurm's variables and ``HPCRL_*`` overrides."""
    task = read_slurm_task(environ, requeue_count)
    jobspec = _read_plan(run_dir)
    values = planned_settings(jobspec) | _env_values(environ)
    named = jobspec.ray_ports.named | _env_ports(environ)
    ports = RayPortsCfg(**job_ports(named, port_band(environ, task)))
    num_nodes = values.pop("num_nodes")
    if num_nodes != task.num_nodes:
        raise NodeSettingsError(
            f"the plan expects {num_nodes} nodes but Slurm started {task.num_nodes} "
            f"(SLURM_JOB_NODELIST hosts: {', '.join(task.node_names)}); submit with --nodes={num_nodes}"
        )
    # Without Slurm there is one node and nothing outside the machine needs to reach it.
    default_ip = None if task.in_slurm else "127.0.0.1"
    node_ip = values.pop("node_ip", None) or default_ip or resolve_ip(task.node_name)
    head_ip = node_ip if task.node_rank == 0 else resolve_ip(task.head_name)
    _check_not_loopback(task, node_ip)
    return NodeSettings(
        run_dir=Path(run_dir).resolve(), task=task, num_nodes=num_nodes, node_ip=node_ip,
        head_ip=head_ip, ray_ports=ports, **values,
    )  # fmt: skip


def port_band(environ: Mapping[str, str], task: SlurmTask) -> int:
    """This job's Ray port band: ``HPCRL_RAY_PORT_BAND``, else from the job's ids (equal on
    every node of the job; see hpcrl.config.port_bands)."""
    text = environ.get(BAND_VARIABLE)
    if text:
        band = _parse(BAND_VARIABLE, text, int)
        if not 0 <= band < NUM_BANDS:
            raise NodeSettingsError(
                f"{BAND_VARIABLE}={band} is not in 0..{NUM_BANDS - 1}; set it in that range, "
                "or unset it to take the band from the job's id"
            )
        return band
    return job_key(task.job_id, task.array_job_id, task.array_task_id) % NUM_BANDS


def planned_settings(jobspec: JobSpec) -> dict[str, Any]:
    """The node settings the plan decided, by ``NodeSettings`` field name."""
    return {
        "num_nodes": jobspec.num_nodes,
        "max_requeues": jobspec.max_requeues,
        "num_gpus": jobspec.slots_per_node if jobspec.device == "gpu" else 0,
        "num_cpus": jobspec.cpus_per_node,  # None: Ray counts the node's CPUs
        "ray_auth": jobspec.ray_auth,
    }


def _read_plan(run_dir: str | os.PathLike[str]) -> JobSpec:
    try:
        return read_jobspec(run_dir)
    except JobSpecError as error:
        raise NodeSettingsError(str(error)) from None


def _env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for variable, (name, kind) in _ENV_SETTINGS.items():
        text = environ.get(variable)
        if text:
            values[name] = _parse(variable, text, kind)
    return values


def _env_ports(environ: Mapping[str, str]) -> dict[str, int]:
    ports = {}
    for field in attrs.fields(RayPortsCfg):
        text = environ.get(f"HPCRL_RAY_{field.name.upper()}")
        if text:
            ports[field.name] = _parse(f"HPCRL_RAY_{field.name.upper()}", text, int)
    return ports


def _parse(variable: str, text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise NodeSettingsError(f"{variable}={text!r} is not a valid {kind.__name__}") from None


def _check_not_loopback(task: SlurmTask, node_ip: str) -> None:
    # Several distinct hosts on a loopback address cannot reach each other; one machine
    # simulating several nodes under one name (tests) can.
    if node_ip.startswith("127.") and len(set(task.node_names)) > 1:
        raise NodeSettingsError(
            f"node {task.node_name} resolves to the loopback address {node_ip}, so other nodes "
            "could not reach its Ray; fix the node's /etc/hosts entry or set HPCRL_NODE_IP"
        )
