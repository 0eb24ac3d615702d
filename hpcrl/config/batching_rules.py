"""Load-time rules of NeMo RL's micro-batching keys: ``policy.dynamic_batching``,
``policy.sequence_packing`` and ``policy.make_sequence_length_divisible_by``."""

from __future__ import annotations

import difflib

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

DYN = "policy.dynamic_batching"
PACK = "policy.sequence_packing"
#: NeMo RL's packing algorithms (its PackingAlgorithm), all four in hpcrl.core.workers
PACKING_ALGORITHMS = (
    "modified_first_fit_decreasing",
    "first_fit_decreasing",
    "first_fit_shuffle",
    "concatenative",
)


def rule_one_batching_mode(recipe: Recipe) -> list[Problem]:
    policy = recipe.policy
    if not (policy.dynamic_batching.enabled and policy.sequence_packing.enabled):
        return []
    return [
        Problem(
            path=f"{DYN}.enabled",
            value=True,
            message=f"dynamic batching and sequence packing exclude each other ({PACK}.enabled "
            "is true too)",
            fix=f"set {DYN}.enabled=false (packing removes more padding) or {PACK}.enabled=false",
        )
    ]


def rule_token_budgets(recipe: Recipe) -> list[Problem]:
    """A budget below max_total_sequence_length: NeMo RL accepts it and fails only when a
    sequence that long arrives (its packer raises, its dynamic batching asserts); hpcrl's
    packer raises the same way (``hpcrl.core.workers.micro_batches``), its dynamic batching
    gives such a row a micro-batch of its own. A warning, so the user knows before the job."""
    policy = recipe.policy
    longest = policy.max_total_sequence_length
    problems = []
    for path, cfg in ((DYN, policy.dynamic_batching), (PACK, policy.sequence_packing)):
        if not cfg.enabled:
            continue
        outcome = (
            "stops the job with an error, as it stops NeMo RL's"
            if path == PACK
            else "gets a micro-batch of its own, over this budget (NeMo RL stops on it)"
        )
        for key in ("train_mb_tokens", "logprob_mb_tokens"):
            budget = getattr(cfg, key)
            if budget is not None and budget < longest:
                problems.append(
                    Problem(
                        path=f"{path}.{key}",
                        value=budget,
                        severity="warning",
                        message=f"smaller than policy.max_total_sequence_length ({longest}): a "
                        f"sequence longer than {budget} tokens {outcome}",
                        fix=f"set {path}.{key} to at least {longest} (NeMo RL writes "
                        "max_total_sequence_length x micro-batch size) if sequences may grow "
                        "that long",
                    )
                )
    return problems


def rule_dynamic_batching_pipeline(recipe: Recipe) -> list[Problem]:
    """Pipeline stages exchange buffers of one shape: dynamic widths cannot pass them."""
    if not recipe.policy.dynamic_batching.enabled or recipe.backend != "megatron":
        return []
    stages = recipe.policy.megatron_cfg.pipeline_model_parallel_size
    if stages <= 1:
        return []
    return [
        Problem(
            path=f"{DYN}.enabled",
            value=True,
            message="dynamic batching gives micro-batches of different shapes, which pipeline "
            f"parallelism cannot pass between stages (pipeline_model_parallel_size="
            f"{stages})",
            fix=f"use {PACK}.enabled=true instead (packs are padded to one length), or "
            "pipeline_model_parallel_size=1",
        )
    ]


def rule_packing_algorithm(recipe: Recipe) -> list[Problem]:
    """Checked while packing is on, as NeMo RL reads it only then (some of its configs
    carry a name no packer has, e.g. modified_ffd, with packing off)."""
    packing = recipe.policy.sequence_packing
    if not packing.enabled or packing.algorithm in PACKING_ALGORITHMS:
        return []
    close = difflib.get_close_matches(packing.algorithm, PACKING_ALGORITHMS, n=1, cutoff=0.3)
    return [
        Problem(
            path=f"{PACK}.algorithm",
            value=packing.algorithm,
            message="not a packing algorithm (NeMo RL's packers have the same four names)",
            fix=(f"did you mean {close[0]}? " if close else "")
            + f"use one of: {', '.join(PACKING_ALGORITHMS)}",
        )
    ]


BATCHING_RULES = (
    rule_packing_algorithm,
    rule_one_batching_mode,
    rule_token_budgets,
    rule_dynamic_batching_pipeline,
)
