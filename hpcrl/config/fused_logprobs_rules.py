"""NeMo RL's ``policy.megatron_cfg.use_fused_linear_logprobs``: log-probs computed from the
hidden states in sequence chunks (the full ``[batch, seq, vocab]`` logits never exist), a
memory saving with the values of the unfused path. hpcrl computes the unfused values; these
rules refuse what NeMo RL refuses with the fused path, and the one case where its fused path
computes something else.
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

KEY = "policy.megatron_cfg.use_fused_linear_logprobs"
OFF = f"or set {KEY}=false"


def rule_fused_linear_logprobs(recipe: Recipe) -> list[Problem]:
    # scalars read off the section, not the section held (benchmarks/offload_fraction_path.py
    # counts the files that hold the Megatron section: tests/test_stage_boundaries.py)
    on = recipe.policy.megatron_cfg.enabled and recipe.policy.megatron_cfg.use_fused_linear_logprobs
    if not on:
        return []
    problems = []
    context_parallel = recipe.policy.megatron_cfg.context_parallel_size
    overlap = recipe.policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather
    if context_parallel > 1:
        problems.append(_conflict(
            "policy.megatron_cfg.context_parallel_size", context_parallel,
            "NeMo RL's fused log-probs do not support context parallelism (it asserts)",
            "set policy.megatron_cfg.context_parallel_size=1",
        ))  # fmt: skip
    if overlap:
        problems.append(_conflict(
            "policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather", True,
            "the fused forward skips the output layer's forward, which the overlapped "
            "parameter gather waits on (NeMo RL asserts)",
            "set policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather=false",
        ))  # fmt: skip
    if recipe.algorithm == "grpo":
        problems += _grpo_problems(recipe)
    return problems


def _grpo_problems(recipe: Recipe) -> list[Problem]:
    generation = recipe.policy.generation
    problems = []
    if recipe.policy.sequence_packing.enabled:
        problems.append(_conflict(
            "policy.sequence_packing.enabled", True,
            "NeMo RL's GRPO does not take fused log-probs with sequence packing (it asserts: "
            "the fused forward would mix tokens across packed sequences)",
            "set policy.sequence_packing.enabled=false",
        ))  # fmt: skip
    if generation.top_k not in (None, 0, -1) or generation.top_p < 1.0:
        problems.append(_conflict(
            "policy.generation.top_k" if generation.top_k not in (None, 0, -1)
            else "policy.generation.top_p",
            generation.top_k if generation.top_k not in (None, 0, -1) else generation.top_p,
            "NeMo RL's fused log-probs come from unfiltered logits, so its GRPO refuses "
            "top-k/top-p filtering with them (it asserts)",
            "set policy.generation.top_k=null and policy.generation.top_p=1.0",
        ))  # fmt: skip
    if generation.temperature != 1.0:
        problems.append(_conflict(
            "policy.generation.temperature", generation.temperature,
            "NeMo RL's fused path divides the log-probs, not the logits, by the temperature "
            "(its unfused path, which hpcrl computes, gives log_softmax(logits / "
            "temperature)): the two differ at any temperature but 1",
            "set policy.generation.temperature=1.0",
        ))  # fmt: skip
    return problems


def _conflict(path: str, value: object, why: str, fix: str) -> Problem:
    return Problem(
        path=path,
        value=value,
        message=f"with {KEY}: true, {why}",
        fix=f"{fix}, {OFF}",
    )


FUSED_LOGPROBS_RULES = (rule_fused_linear_logprobs,)
