"""The cluster-profile schema: where a recipe runs. A site differs from another only here.

Profiles are YAML files found by name on a search path (see ``hpcrl.config.profiles``) or
given as a path. Secrets never live in a profile: ``pass_env`` names variables copied from
the submitting shell into the job at submit time (HF_TOKEN, WANDB_API_KEY, ...).
"""

from __future__ import annotations

from typing import Literal

import attrs

from hpcrl.config.field_bounds import (
    MAX_CPUS_PER_NODE,
    MAX_GPUS_PER_NODE,
    MAX_MEM_GB_PER_NODE,
    MAX_REQUEUES,
    MAX_WORKER_SLOTS_PER_NODE,
    FieldBound,
    at_least,
    bounded,
    node_has_bound,
)
from hpcrl.config.shared_methods import SharedMethods

#: A port the profile sets (unset ones come from the job's band: hpcrl.config.port_bands).
_TCP_PORT = FieldBound(
    low=1024, high=65535, message="not a TCP port", fix="use a port in 1024..32767"
)
_REMOVE_FOR_DEFAULT = "or remove it for Slurm's default"


@attrs.frozen(kw_only=True)
class ContainerCfg(SharedMethods):
    """A pyxis/enroot container for every srun step (``container``)."""

    image: str
    mounts: tuple[str, ...] = ()  # "host:container[:flags]"
    workdir: str | None = None
    mount_home: bool = False


@attrs.frozen(kw_only=True)
class RayPortsCfg(SharedMethods):
    """Ray's ports (and the training group's torch master port). A port left unset (None)
    comes from the job's own port band (``hpcrl.config.port_bands``), so two jobs on one node
    do not collide; a port set here is used by every job of the profile."""

    gcs_port: int | None = bounded(None, _TCP_PORT)
    client_server_port: int | None = bounded(None, _TCP_PORT)
    dashboard_port: int | None = bounded(None, _TCP_PORT)
    node_manager_port: int | None = bounded(None, _TCP_PORT)
    object_manager_port: int | None = bounded(None, _TCP_PORT)
    runtime_env_agent_port: int | None = bounded(None, _TCP_PORT)
    metrics_export_port: int | None = bounded(None, _TCP_PORT)
    dashboard_agent_grpc_port: int | None = bounded(None, _TCP_PORT)
    dashboard_agent_listen_port: int | None = bounded(None, _TCP_PORT)
    min_worker_port: int | None = bounded(None, _TCP_PORT)
    max_worker_port: int | None = bounded(None, _TCP_PORT)
    torch_master_port: int | None = bounded(None, _TCP_PORT)

    @property
    def named(self) -> dict[str, int]:
        """The ports the profile sets."""
        return {name: port for name, port in attrs.asdict(self).items() if port is not None}


@attrs.frozen(kw_only=True)
class SlurmCfg(SharedMethods):
    """Slurm settings (used when ``scheduler: slurm``)."""

    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    time_limit: str = "01:00:00"  # [D-]HH:MM:SS
    exclusive: bool = True
    gres_form: Literal["gres", "gpus_per_node", "none"] = "gres"
    # None: Slurm's default (exclusive nodes get all of it)
    mem_gb: int | None = bounded(
        None, at_least(1, _REMOVE_FOR_DEFAULT), node_has_bound(MAX_MEM_GB_PER_NODE, " GB")
    )
    # after a preemption, the time limit or a lost node, together
    max_requeues: int = bounded(
        2,
        FieldBound(
            low=0, high=MAX_REQUEUES, fix="set {path} to the requeues a run may need, e.g. 2 (0: never)",
            why="Slurm counts a job's restarts in 16 bits, and the job numbers its attempts by "
            "that count (SLURM_RESTART_COUNT wraps around past 65,535)",
        ),
    )  # fmt: skip
    # USR2 this many seconds before the time limit
    signal_delay_s: int = bounded(90, at_least(0, "seconds before the time limit, e.g. 90"))
    # sweeps: at most this many array tasks run at once
    array_parallelism: int = bounded(4, at_least(1, "at most this many sweep points run at once"))
    sbatch_args: tuple[str, ...] = ()  # extra "#SBATCH" arguments, e.g. "--reservation=x"
    srun_args: tuple[str, ...] = ()  # extra srun arguments


#: ``gpus_per_node``: a number, or ``auto`` (local profiles: the GPUs of the submitting
#: machine, counted at plan time without importing torch; CUDA_VISIBLE_DEVICES honoured).
GpuCount = int | Literal["auto"]


@attrs.frozen(kw_only=True)
class ClusterProfile(SharedMethods):
    """One site (``cluster_profiles/<name>.yaml``)."""

    name: str
    scheduler: Literal["slurm", "local"] = "slurm"
    device: Literal["gpu", "cpu"] = "gpu"
    gpus_per_node: GpuCount = bounded(
        8,
        FieldBound(
            low=0, fix="set {path} to the GPUs of one node, e.g. 8 (a CPU profile: 0)",
            why="a count of GPUs per node (a CPU profile requests none: 0)",
        ),
        node_has_bound(MAX_GPUS_PER_NODE),
    )  # fmt: skip
    cpus_per_node: int | None = bounded(
        None, at_least(1, _REMOVE_FOR_DEFAULT), node_has_bound(MAX_CPUS_PER_NODE, " CPUs")
    )
    # CPU profiles: training workers per node
    worker_slots_per_node: int = bounded(1, node_has_bound(MAX_WORKER_SLOTS_PER_NODE))
    slurm: SlurmCfg = attrs.field(factory=SlurmCfg)
    container: ContainerCfg | None = None
    env: dict[str, str] = attrs.field(factory=dict)  # as the JOB sees it (HF_HOME, ...)
    pass_env: tuple[str, ...] = ()  # names copied from the submitting shell, never values
    setup_lines: tuple[str, ...] = ()  # shell lines run before srun (module load ...)
    ray_ports: RayPortsCfg = attrs.field(factory=RayPortsCfg)
    # The interpreter of every task. Unset: the image's python3 with a container, else the
    # interpreter that runs hpcrl (its absolute path, so a node's PATH cannot change it).
    python: str | None = None
    # Where the job's own code comes from. bundle: hpcrl and its pure-Python packages, copied
    # from the submitting environment next to the run folders (the default with a container);
    # installed: the job's Python already has them (the default without one).
    code: Literal["bundle", "installed"] | None = None
    bundle_packages: tuple[str, ...] = ()  # more pure-Python distributions for the bundle
    # "token": the job's Ray cluster admits only holders of the job's own token (hpcrl creates
    # one per run); "none" turns Ray's authentication off, with a warning at every command.
    ray_auth: Literal["token", "none"] = "token"
    # The Ray release of the job's Python (the image's), e.g. "2.55.1": checked against what
    # hpcrl runs on and what ray_auth needs before the queue wait. Unset: known from a NeMo
    # RL release image's tag (hpcrl.plan.images), else checked by each node when the job starts.
    ray_version: str | None = None
    # torch.compile's caches (Inductor, AOTAutograd, Triton), shared by every run: an absolute
    # path as the job sees it, on storage its nodes share. Unset: <runs>/.hpcrl-cache/
    # torch-compile beside the run folders (hpcrl.plan.compile_cache).
    compile_cache_dir: str | None = None

    @property
    def slots_per_node(self) -> int:
        """Training workers per node: GPUs on GPU profiles, worker slots on CPU profiles.

        ``gpus_per_node: auto`` is resolved by the planner before anything reads this."""
        if self.device != "gpu":
            return self.worker_slots_per_node
        assert self.gpus_per_node != "auto", "resolve auto GPUs first"
        return self.gpus_per_node

    @property
    def code_mode(self) -> Literal["bundle", "installed"]:
        if self.code is not None:
            return self.code
        return "bundle" if self.container is not None else "installed"
