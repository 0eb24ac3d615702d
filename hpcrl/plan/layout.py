"""Allocation vs parallel layout: does the job's world size factor into the recipe's layout?"""

from __future__ import annotations

import attrs

from hpcrl.config.node_split import has_separate_generation, node_split
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import AutomodelCfg, Recipe
from hpcrl.plan.findings import Findings
from hpcrl.run.jobspec import ParallelLayout

AUTOMODEL = "policy.automodel_cfg"
MEGATRON = "policy.megatron_cfg"
#: The parallel sizes each backend's layout is made of, by their keys in its section: the
#: layout is given these values, not the section (it reads no other setting).
AUTOMODEL_SIZES = ("dp_replicate_size", "tensor_parallel_size", "context_parallel_size")
MEGATRON_SIZES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)


def profile_path(profile: ClusterProfile, key: str) -> str:
    """How a profile key is named in problems: ``profile[eos].container.mounts``."""
    return f"profile[{profile.name}].{key}"


def check_allocation(recipe: Recipe, profile: ClusterProfile, findings: Findings) -> bool:
    """The profile's nodes must hold the GPUs (CPU worker slots) per node that the recipe's
    ``cluster`` section asks for; fewer is valid and warned about (the job then requests only
    those, ``requested_slots_per_node``). ``cluster`` is the whole job: generation workers of
    their own are carved out of it (``hpcrl.config.node_split``)."""
    num_nodes, gpus_per_node = recipe.cluster.num_nodes, recipe.cluster.gpus_per_node
    slots_key = "gpus_per_node" if profile.device == "gpu" else "worker_slots_per_node"
    ok = True
    if num_nodes < 1:
        findings.error(
            "cluster.num_nodes",
            "must be at least 1",
            value=num_nodes,
            fix="set cluster.num_nodes=1 or more",
        )
        ok = False
    if profile.scheduler == "local" and num_nodes > 1:
        findings.error(
            "cluster.num_nodes",
            f"profile {profile.name!r} runs on this one machine (scheduler: local), not {num_nodes} nodes",
            value=num_nodes,
            fix="set cluster.num_nodes=1, or choose a Slurm profile with --cluster",
        )
        ok = False
    if gpus_per_node > profile.slots_per_node:
        findings.error(
            "cluster.gpus_per_node",
            f"the recipe wants {gpus_per_node} {_per_node_what(recipe, profile)} per node but "
            f"profile {profile.name!r} offers {profile.slots_per_node} ({slots_key})",
            value=gpus_per_node,
            fix=f"set cluster.gpus_per_node to at most {profile.slots_per_node} and raise "
            f"cluster.num_nodes instead, or use a profile whose {slots_key} is "
            f"{gpus_per_node} or more ({profile_path(profile, slots_key)})",
        )
        ok = False
    elif gpus_per_node < profile.slots_per_node:
        _warn_partial_nodes(recipe, profile, findings)
    if ok:
        findings.passed("allocation", _allocation_line(recipe, profile))
    return ok


def _allocation_line(recipe: Recipe, profile: ClusterProfile) -> str:
    num_nodes, per_node = recipe.cluster.num_nodes, recipe.cluster.gpus_per_node
    split = node_split(recipe)
    ranks = split.training_world_size
    if num_nodes * per_node == ranks:
        return f"{num_nodes} node(s) × {per_node} {_unit(profile)} = {ranks} ranks"
    others = "the reward model's and generation's" if split.reward_model_nodes else "generation's"
    return (
        f"{num_nodes} node(s) × {per_node} {_unit(profile)} for the whole job (cluster.*, "
        f"{others} included, as in NeMo RL): {ranks} training ranks"
    )


def requested_slots_per_node(recipe: Recipe, profile: ClusterProfile) -> int:
    """The GPUs (CPU worker slots) the job asks for on each node: the recipe's
    ``cluster.gpus_per_node`` (generation workers of their own take theirs out of it), never
    more than the profile's nodes hold."""
    return max(1, min(recipe.cluster.gpus_per_node, profile.slots_per_node))


def narrow_to_request(profile: ClusterProfile, slots_per_node: int) -> ClusterProfile:
    """The profile as the job sees its nodes: ``slots_per_node`` GPUs (worker slots) each."""
    if profile.device == "gpu":
        return attrs.evolve(profile, gpus_per_node=slots_per_node)
    return attrs.evolve(profile, worker_slots_per_node=slots_per_node)


def _per_node_what(recipe: Recipe, profile: ClusterProfile) -> str:
    return _unit(profile) if has_separate_generation(recipe) else "training ranks"


def _unit(profile: ClusterProfile) -> str:
    return "GPUs" if profile.device == "gpu" else "CPU worker slots"


def _warn_partial_nodes(recipe: Recipe, profile: ClusterProfile, findings: Findings) -> None:
    """Fewer GPUs per node than a node holds: valid; the job asks for only what it uses."""
    wanted, node_slots = recipe.cluster.gpus_per_node, profile.slots_per_node
    unit = _unit(profile)
    slots_key = "gpus_per_node" if profile.device == "gpu" else "worker_slots_per_node"
    # Colocated, cluster.gpus_per_node are all training ranks; split, some are generation's.
    verb, whole = ("uses", "use") if has_separate_generation(recipe) else ("trains on", "train on")
    message = (
        f"the recipe {verb} {wanted} of the {node_slots} {unit} per node of profile "
        f"{profile.name!r} ({slots_key}), so the job requests {wanted} per node"
    )
    rest = node_slots - wanted
    if profile.scheduler == "local":
        message += f"; the other {rest} of this machine stay free for other work"
    elif profile.slurm.exclusive:
        message += (
            f"; the other {rest} of each node stay idle (slurm.exclusive: the job holds "
            "whole nodes)"
        )
    else:
        message += f"; the other {rest} of each node are left to other jobs"
    fixes = [f"set cluster.gpus_per_node={node_slots} to {whole} whole nodes"]
    if profile.scheduler == "slurm" and profile.slurm.exclusive:
        fixes.append(
            f"set {profile_path(profile, 'slurm.exclusive')}: false to leave them to other jobs"
        )
    findings.warn(
        "allocation",
        "cluster.gpus_per_node",
        message,
        value=wanted,
        fix=", or ".join(fixes),
    )


def plan_layout(
    recipe: Recipe, profile: ClusterProfile, findings: Findings
) -> ParallelLayout | None:
    """The backend's layout for the training ranks (``cluster.num_nodes ×
    cluster.gpus_per_node`` less generation's own GPUs); None when it cannot factor."""
    split = node_split(recipe)
    world_size = split.training_world_size
    if recipe.backend == "megatron":
        sizes = {key: getattr(recipe.policy.megatron_cfg, key) for key in MEGATRON_SIZES}
        layout = _megatron_layout(sizes, world_size, findings)
    else:
        automodel = recipe.policy.automodel_cfg
        sizes = {key: getattr(automodel, key) for key in AUTOMODEL_SIZES}
        layout = _automodel_layout(sizes, automodel.expert_parallel_size, world_size, findings)
        if layout is not None and not _expert_parallel_fits(automodel, layout.dp_shard, findings):
            return None
    if layout is None:
        return None
    # Training ranks per node: fewer than the node holds when the recipe leaves some idle.
    _check_tp_inside_node(recipe, layout, split.training_gpus_per_node, findings)
    if layout.backend == "automodel":
        _check_hsdp_groups(layout, split.training_nodes, findings)
    findings.passed("layout", f"{layout.backend}: {layout.describe()} = {world_size} ranks")
    return layout


def check_batch_sizes(recipe: Recipe, layout: ParallelLayout, findings: Findings) -> None:
    """``train_global_batch_size`` must split evenly into dp ranks × micro batches."""
    global_batch = recipe.policy.train_global_batch_size
    micro_batch = recipe.policy.train_micro_batch_size
    if micro_batch < 1 or global_batch < 1:
        findings.error(
            "policy.train_micro_batch_size"
            if micro_batch < 1
            else "policy.train_global_batch_size",
            "batch sizes must be at least 1",
            value=micro_batch if micro_batch < 1 else global_batch,
            fix="set a positive integer",
        )
        return
    step = layout.dp * micro_batch
    if global_batch % step:
        lower = max(step, global_batch - global_batch % step)
        findings.error(
            "policy.train_global_batch_size",
            f"must be a multiple of dp ({layout.dp}) × policy.train_micro_batch_size ({micro_batch}) = {step}",
            value=global_batch,
            fix=f"set policy.train_global_batch_size to a multiple of {step} (e.g. {lower} or {lower + step}), "
            f"or change policy.train_micro_batch_size",
        )
        return
    findings.passed(
        "batch",
        f"global batch {global_batch} = dp {layout.dp} × micro {micro_batch} × "
        f"{global_batch // step} accumulation step(s)",
    )


def _automodel_layout(
    sizes: dict[str, int], ep: int, world_size: int, findings: Findings
) -> ParallelLayout | None:
    """``sizes``: ``AUTOMODEL_SIZES`` by key, as the recipe holds them; ``ep``: the expert
    parallel size (checked against the layout by ``_expert_parallel_fits``)."""
    if not _sizes_positive(AUTOMODEL, sizes, findings):
        return None
    dp_replicate, tp, cp = (sizes[key] for key in AUTOMODEL_SIZES)
    product = dp_replicate * tp * cp
    if world_size % product:
        _report_product(AUTOMODEL, sizes, product, world_size, findings)
        return None
    dp_shard = world_size // product
    return ParallelLayout(
        backend="automodel",
        world_size=world_size,
        dp=dp_replicate * dp_shard,
        dp_replicate=dp_replicate,
        dp_shard=dp_shard,
        tp=tp,
        cp=cp,
        ep=ep,
    )


def _expert_parallel_fits(cfg: AutomodelCfg, dp_shard: int, findings: Findings) -> bool:
    """EP groups are carved from the FSDP shard ranks (NeMo RL: ep divides dp × cp; hpcrl's
    EP is built for plain FSDP2 only: its groups are consecutive ranks, which under context
    parallelism would be CP peers holding parts of the same rows)."""
    ep = cfg.expert_parallel_size
    if ep == 1:
        return True
    path = f"{AUTOMODEL}.expert_parallel_size"
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        findings.error(path, "must be a positive integer", value=ep, fix=f"set {path}=1 or more")
        return False
    # (key, value, what it is, the value that works with EP)
    others = (
        ("dp_replicate_size", cfg.dp_replicate_size, "HSDP replicas", 1),
        ("tensor_parallel_size", cfg.tensor_parallel_size, "tensor parallelism", 1),
        ("context_parallel_size", cfg.context_parallel_size, "context parallelism", 1),
        ("cpu_offload", cfg.cpu_offload, "FSDP2's CPU offload", False),
        ("optimizer_offload_fraction", cfg.optimizer_offload_fraction, "optimizer offload", 0.0),
        ("reference_on_host", cfg.reference_on_host, "the host-resident reference model", False),
        ("lora_cfg.enabled", cfg.lora_cfg.enabled, "LoRA adapters", False),
    )
    ok = True
    for key, value, what, works in others:
        if value != works:
            findings.error(
                path,
                f"expert parallelism together with {what} ({AUTOMODEL}.{key}={value}) is not "
                "supported by the automodel backend yet",
                value=ep,
                fix=f"set {path}=1, or {AUTOMODEL}.{key}={str(works).lower()}",
            )
            ok = False
    if ok and cfg.torch_compile:
        findings.warn(
            "expert_parallel",
            f"{AUTOMODEL}.torch_compile",
            "decoder blocks are not compiled under expert parallelism (their MoE blocks run "
            "collectives and data-dependent expert loops); the model trains eager",
            value=True,
            fix=f"set {AUTOMODEL}.torch_compile=false to say so, or {path}=1 to compile",
        )
    if ok and dp_shard % ep:
        valid = [d for d in _divisors(dp_shard) if d > 1]
        findings.error(
            path,
            f"must divide the data-parallel shard size {dp_shard} (training ranks / "
            "(dp_replicate_size × tensor_parallel_size × context_parallel_size)): each "
            "expert group is that many data-parallel ranks",
            value=ep,
            fix=f"set {path} to one of {valid}" if valid else f"set {path}=1",
        )
        ok = False
    return ok


def _megatron_layout(
    sizes: dict[str, int], world_size: int, findings: Findings
) -> ParallelLayout | None:
    """``sizes``: ``MEGATRON_SIZES`` by key, as the recipe holds them."""
    if not _sizes_positive(MEGATRON, sizes, findings):
        return None
    tp, pp, cp, ep, etp = (sizes[key] for key in MEGATRON_SIZES)
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        dense = {key: sizes[key] for key in list(sizes)[:3]}
        _report_product(MEGATRON, dense, model_parallel, world_size, findings)
        return None
    # megatron-core: the expert layout (ep × etp) must tile the ranks of one pipeline stage.
    ranks_per_stage = world_size // pp
    if ranks_per_stage % (ep * etp):
        valid = [d for d in _divisors(ranks_per_stage // etp)] if ranks_per_stage % etp == 0 else []
        findings.error(
            f"{MEGATRON}.expert_model_parallel_size",
            f"expert_model_parallel_size ({ep}) × expert_tensor_parallel_size ({etp}) must divide "
            f"world size / pipeline_model_parallel_size = {world_size} / {pp} = {ranks_per_stage}",
            value=ep,
            fix=f"set {MEGATRON}.expert_model_parallel_size to one of {valid}"
            if valid
            else f"set {MEGATRON}.expert_tensor_parallel_size to a divisor of {ranks_per_stage}",
        )
        return None
    return ParallelLayout(
        backend="megatron",
        world_size=world_size,
        dp=world_size // model_parallel,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
    )


def _sizes_positive(section: str, sizes: dict[str, int], findings: Findings) -> bool:
    ok = True
    for key, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            findings.error(
                f"{section}.{key}",
                "must be a positive integer",
                value=size,
                fix=f"set {section}.{key}=1 or more",
            )
            ok = False
    return ok


def _report_product(
    section: str, sizes: dict[str, int], product: int, world_size: int, findings: Findings
) -> None:
    shown = " × ".join(f"{key}={size}" for key, size in sizes.items())
    culprit = max(
        (key for key in sizes if sizes[key] > 1),
        key=lambda key: sizes[key] if world_size % sizes[key] else 0,
    )
    findings.error(
        f"{section}.{culprit}",
        f"{shown} = {product} does not divide the world size {world_size} "
        f"(cluster.num_nodes × cluster.gpus_per_node)",
        value=sizes[culprit],
        fix=f"choose sizes whose product divides {world_size}: one of {_divisors(world_size)}",
    )


def _check_tp_inside_node(
    recipe: Recipe, layout: ParallelLayout, ranks_per_node: int, findings: Findings
) -> None:
    if layout.tp <= ranks_per_node:
        return
    key = "tensor_model_parallel_size" if layout.backend == "megatron" else "tensor_parallel_size"
    section = MEGATRON if layout.backend == "megatron" else AUTOMODEL
    findings.warn(
        "tp_inside_node",
        f"{section}.{key}",
        f"tensor parallelism over {layout.tp} ranks spans nodes of {ranks_per_node} training "
        "ranks each; its all-reduces then cross the inter-node network on every layer",
        value=layout.tp,
        fix=f"keep {section}.{key} ≤ {ranks_per_node} and use data/pipeline parallelism across nodes",
    )


def _check_hsdp_groups(layout: ParallelLayout, num_nodes: int, findings: Findings) -> None:
    if layout.dp_replicate <= 1:
        return
    if layout.dp_replicate % num_nodes == 0:
        findings.passed(
            "hsdp", f"{layout.dp_replicate} replicas; each shard group stays inside a node"
        )
        return
    shard_group = layout.dp_shard * layout.tp * layout.cp
    per_replica = layout.world_size // (layout.tp * layout.cp)
    valid = [d for d in _divisors(per_replica) if d % num_nodes == 0]
    findings.warn(
        "hsdp",
        f"{AUTOMODEL}.dp_replicate_size",
        f"with {num_nodes} node(s) each HSDP shard group of {shard_group} ranks spans nodes, so "
        f"FSDP all-gathers cross the inter-node network",
        value=layout.dp_replicate,
        fix=f"set {AUTOMODEL}.dp_replicate_size to a multiple of cluster.num_nodes={num_nodes}"
        + (f": one of {valid}" if valid else ""),
    )


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]
