"""The plan of one job: everything the templates, the submitter and the node entrypoint need.

A ``JobSpec`` is the only input of rendering and the job's only input: it carries the typed,
validated recipe it was planned from (``JobSpec.recipe``, data paths absolute, NeMo RL's
data sections resolved), so the job never loads YAML, checks a recipe against its plan nor
merges data defaults. It is explicit on purpose: no field
has to be recomputed from the recipe or the profile downstream, and nothing here is a raw
dict. Every collection is a tuple in a fixed order, so two equal plans render byte-identical
scripts.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Literal

import attrs

from hpcrl.config.profile import RayPortsCfg
from hpcrl.config.recipe import Recipe
from hpcrl.config.shared_methods import SharedMethods

#: Slurm sends this signal ``signal_delay_s`` before the time limit; submitit's job
#: environment handles it (checkpoint + requeue), so it must stay USR2.
SUBMITIT_SIGNAL = "USR2"
#: submitit's task command after the interpreter: ``<python> -u -m submitit.core._submit <folder>``.
SUBMITIT_TASK_TAIL = ("-u", "-m", "submitit.core._submit")


@attrs.frozen(kw_only=True)
class ParallelLayout(SharedMethods):
    """How ``world_size`` ranks split into parallel groups.

    Automodel uses ``dp_replicate × dp_shard × tp × cp``; Megatron ``tp × pp × cp × dp`` with
    experts laid out as ``ep × etp`` inside ``world_size / pp``. Unused sizes stay 1.
    ``dp`` is the total data-parallel size (the divisor of the global batch).
    """

    backend: Literal["automodel", "megatron"]
    world_size: int
    dp: int
    tp: int = 1
    cp: int = 1
    dp_replicate: int = 1  # automodel HSDP replicas (one per node when it divides nodes)
    dp_shard: int = 1  # automodel FSDP shard group size
    pp: int = 1  # megatron pipeline stages
    ep: int = 1  # expert parallel size (automodel: EP groups of ep ranks inside dp_shard)
    etp: int = 1  # megatron expert tensor parallel size

    def describe(self) -> str:
        """One line for tables and logs, e.g. ``dp_replicate=2 × dp_shard=4 × tp=2 × cp=1``."""
        if self.backend == "automodel":
            sizes = [("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard)]
            sizes += [("tp", self.tp), ("cp", self.cp)]
            if self.ep > 1:
                sizes += [("ep", self.ep)]
        else:
            sizes = [("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("dp", self.dp)]
            if self.ep > 1 or self.etp > 1:
                sizes += [("ep", self.ep), ("etp", self.etp)]
        return " × ".join(f"{name}={size}" for name, size in sizes)


@attrs.frozen(kw_only=True)
class GenerationPlacement(SharedMethods):
    """Where separate (non-colocated) generation workers run among the job's nodes: vLLM
    engines, or (``policy.generation.backend: megatron``) hpcrl's torch sampler refitted from
    the Megatron policy, as NeMo RL's dedicated Megatron inference model is.

    Nodes are numbered as the job orders them (node 0 is the driver's). Training always takes
    nodes ``0 .. training_nodes-1``; generation takes ``num_nodes`` nodes from ``first_node``:
    ``training_nodes`` when it has nodes of its own, 0 when it shares the training nodes'
    remaining GPUs. ``slots`` are GPUs on GPU profiles, CPU worker slots on CPU profiles.
    """

    first_node: int
    num_nodes: int
    slots_per_node: int
    num_engines: int
    slots_per_engine: int  # vllm_cfg.tensor_parallel_size × pipeline_parallel_size (GPU)
    training_nodes: int
    training_slots_per_node: int
    backend: str = "vllm"  # policy.generation.backend: vllm | megatron
    # > 1: each vLLM engine spans this many whole nodes (hpcrl.plan.engine_nodes)
    nodes_per_engine: int = 1

    @property
    def shares_nodes(self) -> bool:
        return self.first_node < self.training_nodes

    @property
    def job_nodes(self) -> int:
        """Nodes the job allocates for both sides."""
        return max(self.training_nodes, self.first_node + self.num_nodes)

    def describe(self, unit: str) -> str:
        """One line for the script, e.g. ``training on nodes 0-1 (8 GPUs each); vLLM
        generation on node 2 (8 GPUs each; 4 engine(s) of 2)``."""
        other = "the other " if self.shares_nodes else ""
        engine = _SEPARATE_ENGINES[self.backend]
        return (
            f"training on {_nodes(0, self.training_nodes)} ({self.training_slots_per_node} "
            f"{unit} each); {engine} on {_nodes(self.first_node, self.num_nodes)} "
            f"({other}{self.slots_per_node} {unit} each; {self.num_engines} engine(s) of "
            f"{self.slots_per_engine}"
            + (f" across {self.nodes_per_engine} nodes each)" if self.nodes_per_engine > 1 else ")")
        )


@attrs.frozen(kw_only=True)
class RewardModelPlacement(SharedMethods):
    """Where the reward-model environment's scorers run (``env.reward_model.resources``,
    carved out of the job as NeMo RL carves it: hpcrl.config.node_split): ``num_nodes``
    nodes from ``first_node`` (node 0, shared with the policy, on a one-node job),
    ``slots_per_node`` GPUs (CPU worker slots) each, one scorer on each."""

    first_node: int
    num_nodes: int
    slots_per_node: int

    @property
    def num_scorers(self) -> int:
        return self.num_nodes * self.slots_per_node

    def describe(self, unit: str) -> str:
        """One line, e.g. ``reward model: 1 GPU on node 0 (one scorer per GPU, ...)``."""
        one = unit.removesuffix("s")
        return (
            f"reward model: {self.slots_per_node} {one if self.slots_per_node == 1 else unit} "
            f"on {'each of ' if self.num_nodes > 1 else ''}"
            f"{_nodes(self.first_node, self.num_nodes)} (one scorer per {one}, the whole "
            "model on each; the conversations split evenly over them)"
        )


#: How ``describe`` names the separate engines of each generation backend.
_SEPARATE_ENGINES = {
    "vllm": "vLLM generation",
    "megatron": "Megatron generation (hpcrl's torch sampler, refitted from the policy)",
}


def _nodes(first: int, count: int) -> str:
    return f"node {first}" if count == 1 else f"nodes {first}-{first + count - 1}"


#: The job's Ray token file, relative to the run folder (created by hpcrl.run.ray_token):
#: read by every node and the driver, written nowhere else.
AUTH_DIR_NAME = "auth"
TOKEN_FILE_NAME = "ray_token"
#: Ray's authentication variables: with ``ray_auth`` hpcrl alone sets them in the job.
RAY_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
#: The first Ray with token authentication (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH) is 2.52.0
#: (docs.ray.io, ray-security/token-auth). An older Ray ignores both variables, and images
#: pinning one exist (NeMo RL's pin ray 2.49.2): with ``ray_auth: token`` the job's preflight
#: refuses it (hpcrl.job.preflight).
RAY_TOKEN_AUTH_SPEC = ">=2.52"


def token_path(run_dir: str) -> str:
    """Where the job's token lives (``<run_dir>/auth/ray_token``)."""
    return posixpath.join(run_dir, AUTH_DIR_NAME, TOKEN_FILE_NAME)


@attrs.frozen(kw_only=True)
class ContainerSpec(SharedMethods):
    """The pyxis container every srun task runs in; mounts are ``host:container[:flags]``."""

    image: str
    mounts: tuple[str, ...]
    workdir: str | None
    mount_home: bool


Need = Literal[
    "every job", "the Megatron backend", "the Megatron backend on CPU", "vLLM generation"
]


@attrs.frozen(kw_only=True)
class PackageRequirement(SharedMethods):
    """A package the job's Python must have (``hpcrl.plan.requirements``); checked on every
    node before Ray starts. ``distributions``: the names it is published under, the first
    named in messages. ``spec``: ``>=a,<b`` clauses, ``||`` between alternatives, compared on
    release numbers. ``pure_python``: a profile's ``bundle_packages`` can supply it too."""

    distributions: tuple[str, ...]
    module: str  # what the job imports; found without its metadata: version unknown
    spec: str
    needed_for: Need
    pure_python: bool


@attrs.frozen(kw_only=True)
class CodeBundle(SharedMethods):
    """hpcrl and its pure-Python packages, copied from the submitting environment into a
    folder named by a hash of its contents (``hpcrl.plan.bundle``), shared by every run of the
    same code. ``path`` is the same inside a container (mounted 1:1)."""

    path: str
    digest: str
    packages: tuple[tuple[str, str], ...]  # (distribution, version) besides hpcrl, by name
    extra_packages: tuple[str, ...]  # the profile's bundle_packages among them
    built_from: str  # sys.prefix of the environment the files were copied from


@attrs.frozen(kw_only=True)
class JobCode(SharedMethods):
    """Which Python runs every task and where hpcrl comes from inside the job.

    ``python``: the interpreter's argv as the task starts it (``/usr/bin/env python3`` in a
    container: srun looks a bare command up on the host, before pyxis enters the image).
    ``python_origin`` says where that choice came from, for the script's comment.
    ``hpcrl_version``/``git_sha``: the code that planned the job (the bundle holds exactly it;
    an installed hpcrl of another version is a preflight error). ``requirements``: what the
    job's Python must provide, checked before Ray starts.
    """

    mode: Literal["bundle", "installed"]
    python: tuple[str, ...]
    python_origin: str
    hpcrl_version: str
    git_sha: str | None
    bundle: CodeBundle | None
    requirements: tuple[PackageRequirement, ...]

    @property
    def entry_argv(self) -> tuple[str, ...]:
        """What runs a module: the interpreter, then (bundle) the bundle's entry script."""
        if self.bundle is None:
            return self.python
        return (*self.python, f"{self.bundle.path}/{BUNDLE_ENTRY}")


#: The bundle's entry script (``hpcrl/job/bundle_entry.py``, copied to the bundle's top):
#: ``python3 <bundle>/hpcrl_entry.py -u -m MODULE ARGS`` runs MODULE with the bundle first
#: on the import path, in this process and in every process it starts.
BUNDLE_ENTRY = "hpcrl_entry.py"


@attrs.frozen(kw_only=True)
class Check(SharedMethods):
    """One pre-flight check that did not fail: what it checked and what it found."""

    name: str
    status: Literal["passed", "warned"]
    message: str
    path: str = ""  # warnings only: the key the warning is about
    fix: str = ""  # warnings only: what to change to silence it

    def format(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@attrs.frozen(kw_only=True)
class MachineNeed(SharedMethods):
    """A planned setting that runs only on a machine that has ``needs``: Transformer Engine
    importable, CUDA (a GPU plan), or DeepEP's kernels (``deep_ep``'s ``Buffer``, or its
    ``HybridEPBuffer``: megatron-core's flex dispatcher). Decided once by the planner (``hpcrl.plan.machine_needs``)
    from the recipe; the job's preflight (``hpcrl.core.machine_checks``) holds the machine to
    it and, where it falls short, reports ``path = value: message; fix: fix``."""

    needs: Literal["transformer_engine", "cuda", "deep_ep", "hybrid_ep"]
    path: str  # the recipe key, e.g. policy.megatron_cfg.sequence_parallel
    value: bool | str  # as planned
    message: str
    fix: str


@attrs.frozen(kw_only=True)
class JobSpec(SharedMethods):
    """A planned job (see ``hpcrl.plan.planner.plan``).

    ``sbatch_directives`` are ``(key, value)`` pairs sorted by key; a ``None`` value is a bare
    flag (``#SBATCH --exclusive``). ``env`` pairs are sorted by name and hold literal values.
    ``pass_env`` names are exported in the job only when the submitting shell set them; their
    values never appear in the script.
    """

    job_name: str
    scheduler: Literal["slurm", "local"]
    device: Literal["gpu", "cpu"]
    profile_name: str
    recipe_source: str
    algorithm: Literal["grpo", "sft"]
    overrides: tuple[str, ...]
    # The recipe as planned: validated, overrides applied, data paths absolute, data.train and
    # data.validation holding what data.default and the flat data.* keys give them (those
    # unset: hpcrl.config.datasets.resolve_data_sections). The job reads it from here (never
    # recipe.resolved.yaml, which is for people, diff and rerun).
    recipe: Recipe
    # What the job needs of the machine it lands on (hpcrl.plan.machine_needs), in the order
    # the preflight reports it; no default, so a plan written without it is refused, not unchecked.
    machine_needs: tuple[MachineNeed, ...]
    # The hpcrl command that wrote this script and reproduces it: `hpcrl render ... [-o DIR]`
    # for a single run (hpcrl submit runs it), `hpcrl sweep ...` for a sweep's scripts,
    # `hpcrl rerun RUN ...` for a rerun.
    written_by: tuple[str, ...]
    run_dir: str  # absolute; also the container-side path (it is always mounted 1:1)
    num_nodes: int
    slots_per_node: int  # GPUs per node, or CPU worker slots on CPU profiles
    cpus_per_node: int | None
    layout: ParallelLayout
    sbatch_directives: tuple[tuple[str, str | None], ...]
    srun_args: tuple[str, ...]  # every srun argument, in order (hpcrl's, container, profile)
    container: ContainerSpec | None
    env: tuple[tuple[str, str], ...]
    pass_env: tuple[str, ...]
    setup_lines: tuple[str, ...]  # raw shell from the profile, run before srun (by design)
    ray_ports: RayPortsCfg
    ray_auth: Literal["token", "none"] = "token"  # token: <run_dir>/auth/ray_token, never here
    megatron_checkpoint_dir: str | None  # as the job sees it; None for automodel
    megatron_checkpoint_dir_source: str | None  # NRL_MEGATRON_CHECKPOINT_DIR | HF_HOME | home
    # torch.compile's caches, shared by runs (hpcrl.plan.compile_cache; env holds its variables)
    compile_cache_dir: str | None = None
    code: JobCode  # the interpreter, where hpcrl comes from, what the job's Python must have
    # `<python> [<bundle>/hpcrl_entry.py] -u -m submitit.core._submit <run_dir>/submitit`
    task_argv: tuple[str, ...]
    submitit_folder: str
    stdout_path: str  # submitit's per-task pattern: %j_%t_log.out (arrays: %A_%a_%t_log.out)
    stderr_path: str
    array_size: int | None = None
    array_parallelism: int | None = None
    signal_delay_s: int = 90
    max_requeues: int = 0
    requeue: bool = True
    checks: tuple[Check, ...] = ()
    generation: GenerationPlacement | None = None  # separate vLLM generation workers only
    reward_model: RewardModelPlacement | None = None  # the reward-model environment's scorers
    # Colocated vLLM: consecutive training ranks of one node per engine (tp × pp); rank
    # k·n builds engine k over the group's GPUs / cores. 1 for every other generation.
    colocated_engine_ranks: int = 1
    # Local GPU profiles: the GPUs of this machine the job uses (CUDA_VISIBLE_DEVICES ids).
    visible_gpus: tuple[str, ...] | None = None

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def run_it_with(self) -> str:
        """The command that submits this script: ``hpcrl submit`` for a rendered run, else the
        command that wrote it (``hpcrl sweep``, ``hpcrl rerun``)."""
        verb = self.written_by[1] if len(self.written_by) > 1 else "render"
        return f"hpcrl {'submit' if verb == 'render' else verb}"

    @property
    def python_command(self) -> str:
        """What submitit calls ``python``: everything of the task command before ``-u -m``."""
        return shlex.join(self.task_argv[: -len(SUBMITIT_TASK_TAIL) - 1])

    @property
    def task_command(self) -> str:
        """The task command as one shell-quoted string (what submitit calls ``command``)."""
        return shlex.join(self.task_argv)

    @property
    def ray_token_path(self) -> str | None:
        """The job's Ray token file (None when ``ray_auth`` is ``none``); never its content."""
        return token_path(self.run_dir) if self.ray_auth == "token" else None

    @property
    def ray_auth_needs(self) -> str | None:
        """The Ray that ``ray_auth`` needs beyond the package table (None with ``none``)."""
        return f"ray{RAY_TOKEN_AUTH_SPEC}" if self.ray_auth == "token" else None

    @property
    def signal(self) -> str:
        """``USR2@<seconds>``: what ``#SBATCH --signal`` gets."""
        return f"{SUBMITIT_SIGNAL}@{self.signal_delay_s}"

    @property
    def warnings(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.status == "warned")

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)
