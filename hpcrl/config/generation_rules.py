"""Rules of ``policy.generation.backend: megatron``: NeMo RL's sampling from the Megatron
policy's own weights, on the training workers (colocated) or on a dedicated inference model
of its own GPUs (not colocated).

hpcrl samples for it with its torch sampler, inside each Megatron worker or in generation
workers of their own (``hpcrl.plan.generation``), fed the policy's current weights by the
Megatron refit (megatron-bridge's HF export) before every generation: the same model, the
same sampling (temperature, top_p, top_k, max_new_tokens, the EOS token and stop_strings,
which are what NeMo RL's Megatron generation honours). What that cannot be is refused here:
generation from a policy that is not a Megatron model, and stop tokens NeMo RL's Megatron
generation does not stop at; the engine options of ``policy.generation.mcore_generation_config``
by ``hpcrl.config.nemo_rl_filter``.
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

BACKEND = "policy.generation.backend"


def rule_megatron_generation_needs_megatron_policy(recipe: Recipe) -> list[Problem]:
    """NeMo RL's Megatron generation wraps the Megatron training policy (colocated) or
    builds a Megatron inference model from ``policy.megatron_cfg``: there is none to sample
    from while the Automodel (DTensor) backend trains."""
    if recipe.policy.generation.backend != "megatron" or recipe.backend == "megatron":
        return []
    return [
        Problem(
            path=BACKEND,
            value="megatron",
            message="Megatron generation samples from the Megatron policy model, and this "
            "recipe trains with the Automodel backend (policy.megatron_cfg.enabled is false)",
            fix="set policy.megatron_cfg.enabled=true and policy.automodel_cfg.enabled=false, "
            "or policy.generation.backend=vllm (or torch: hpcrl's in-process sampler)",
        )
    ]


def rule_megatron_generation_stop_tokens(recipe: Recipe) -> list[Problem]:
    """NeMo RL's Megatron generation ends a sample at the tokenizer's EOS token or at a stop
    string, never at ``stop_token_ids``: hpcrl stopping there would sample different text."""
    generation = recipe.policy.generation
    if generation.backend != "megatron" or not generation.stop_token_ids:
        return []
    return [
        Problem(
            path="policy.generation.stop_token_ids",
            value=list(generation.stop_token_ids),
            message="NeMo RL's Megatron generation stops only at the EOS token and at "
            "stop_strings; it does not read stop_token_ids, so the samples would differ",
            fix="remove policy.generation.stop_token_ids (or write them as "
            "policy.generation.stop_strings), or set policy.generation.backend=vllm",
        )
    ]


def rule_refit_transport_needs_vllm(recipe: Recipe) -> list[Problem]:
    """NeMo RL raises for a refit transport under any backend but vLLM (grpo.py setup)."""
    generation = recipe.policy.generation
    if generation.refit_transport is None or generation.backend == "vllm":
        return []
    return [
        Problem(
            path="policy.generation.refit_transport",
            value=generation.refit_transport,
            message="a refit transport moves weights into vLLM engines; NeMo RL refuses it "
            f"with the {generation.backend} backend, which has none",
            fix="set policy.generation.refit_transport=null, or policy.generation.backend=vllm",
        )
    ]


GENERATION_RULES = (
    rule_megatron_generation_needs_megatron_policy,
    rule_megatron_generation_stop_tokens,
    rule_refit_transport_needs_vllm,
)
