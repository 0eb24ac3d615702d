"""Cross-field rules of a recipe: each a small function ``Recipe -> list[Problem]``.

``check_recipe`` runs them all; every problem names its full key path, the bad value and the
fix. Megatron-specific rules live in ``hpcrl.config.megatron_rules``; those of
``model_overrides`` and ``teacher.megatron_cfg_overrides`` in ``hpcrl.config.override_rules``,
with ``MODEL_OVERRIDES_CHECKED_IN_JOB``, the hook for the Megatron backend. Allocation vs parallel
layout needs the cluster profile and is checked by the planner (``hpcrl.plan``).

Batch semantics (as in NeMo RL): one GRPO step generates ``num_prompts_per_step *
num_generations_per_prompt`` rollouts; the policy then takes one optimizer step per
``policy.train_global_batch_size`` of them, so that number must divide the rollouts; each
optimizer step accumulates gradients over micro-batches of ``train_micro_batch_size``.
"""

from __future__ import annotations

from hpcrl.config.advantage_rules import ADVANTAGE_RULES
from hpcrl.config.async_rl_rules import ASYNC_RL_RULES
from hpcrl.config.async_settings import async_grpo_settings
from hpcrl.config.batching_rules import BATCHING_RULES
from hpcrl.config.checkpoint_metrics import CHECKPOINT_METRIC_RULES
from hpcrl.config.datasets import DATA_RULES
from hpcrl.config.env_rules import ENV_RULES
from hpcrl.config.errors import Problem
from hpcrl.config.field_bounds import check_field_bounds
from hpcrl.config.foreign_key_table import UNSUPPORTED_SECTIONS
from hpcrl.config.fused_logprobs_rules import FUSED_LOGPROBS_RULES
from hpcrl.config.generation_rules import GENERATION_RULES
from hpcrl.config.grpo_option_rules import GRPO_OPTION_RULES
from hpcrl.config.lora_rules import LORA_RULES
from hpcrl.config.loss_rules import LOSS_RULES
from hpcrl.config.megatron_rules import MEGATRON_RULES
from hpcrl.config.node_split import rule_node_split
from hpcrl.config.optimizers import OPTIMIZER_RULES
from hpcrl.config.override_rules import (
    MODEL_OVERRIDES_CHECKED_IN_JOB,
    OVERRIDE_RULES,
    provider_field_problems,
)
from hpcrl.config.range_rules import RANGE_RULES
from hpcrl.config.recipe import Recipe
from hpcrl.config.reward_model_rules import REWARD_MODEL_RULES
from hpcrl.config.save_deadline import rule_save_deadline

__all__ = [
    "check_recipe",
    "RECIPE_RULES",
    "MODEL_OVERRIDES_CHECKED_IN_JOB",
    "provider_field_problems",
]

BACKEND_FIX = (
    "set policy.megatron_cfg.enabled=true or policy.automodel_cfg.enabled=true (exactly one)"
)
AUTOMODEL = "policy.automodel_cfg"


def rule_field_bounds(recipe: Recipe) -> list[Problem]:
    """Each field's own range, declared beside it (``bounded`` in the schema)."""
    return check_field_bounds(recipe)


def check_recipe(recipe: Recipe) -> list[Problem]:
    """Every recipe rule's problems, in a fixed order."""
    problems: list[Problem] = []
    for rule in RECIPE_RULES:
        problems += rule(recipe)
    return problems


def rule_one_backend(recipe: Recipe) -> list[Problem]:
    megatron = recipe.policy.megatron_cfg.enabled
    automodel = recipe.policy.automodel_cfg.enabled
    if megatron != automodel:
        return []
    message = "both backends are enabled" if megatron else "no backend is enabled"
    return [
        Problem(
            path="policy.megatron_cfg.enabled",
            value=megatron,
            message=f"{message} (policy.megatron_cfg.enabled={str(megatron).lower()}, policy.automodel_cfg.enabled={str(automodel).lower()})",
            fix=BACKEND_FIX,
        )
    ]


def rule_one_algorithm(recipe: Recipe) -> list[Problem]:
    has_grpo, has_sft = recipe.grpo is not None, recipe.sft is not None
    if has_grpo != has_sft:
        return []
    message = (
        "both grpo and sft sections are given"
        if has_grpo
        else "neither a grpo nor an sft section is given"
    )
    return [
        Problem(
            path="grpo" if has_grpo else "<top>",
            message=f"{message}; a recipe trains with exactly one algorithm",
            fix="keep exactly one of the grpo: and sft: sections (a base's section can be removed with sft: null)",
        )
    ]


def rule_unsupported_sections(recipe: Recipe) -> list[Problem]:
    """value/teacher are parsed and checked, but nothing trains with them yet: say so."""
    return [
        Problem(
            path=section,
            value="...",
            message=reason,
            fix=f"remove the {section}: section (or set {section}: null)",
        )
        for section, reason in UNSUPPORTED_SECTIONS.items()
        if getattr(recipe, section) is not None
    ]


def rule_automodel_context_parallel(recipe: Recipe) -> list[Problem]:
    """Context parallelism (``hpcrl.core.backends.automodel.context_parallel``) splits every
    row of a micro-batch over CP ranks. Refused where it cannot run: with sequence packing (a
    pack's sequences would need per-sequence chunks; NeMo RL refuses it too) and with
    sequence parallelism at TP > 1 (NeMo RL refuses it: a known DTensor issue; hpcrl's
    sequence-parallel plan also splits the very rows CP has already split)."""
    cfg = recipe.policy.automodel_cfg
    if not cfg.enabled or cfg.context_parallel_size <= 1:
        return []
    path, cp = f"{AUTOMODEL}.context_parallel_size", cfg.context_parallel_size
    problems = []
    if recipe.policy.sequence_packing.enabled:
        problems.append(
            Problem(
                path=path,
                value=cp,
                message="context parallelism does not run with policy.sequence_packing "
                "(NeMo RL refuses the pair too): a pack would need each of its sequences cut "
                "into CP chunks",
                fix=f"set policy.sequence_packing.enabled=false (policy.dynamic_batching "
                f"also bounds micro-batches by tokens), or {path}=1",
            )
        )
    if cfg.sequence_parallel and cfg.tensor_parallel_size > 1:
        problems.append(
            Problem(
                path=path,
                value=cp,
                message="context parallelism does not run with sequence_parallel at "
                "tensor_parallel_size > 1 (NeMo RL refuses the pair too, its issue 659)",
                fix=f"set {AUTOMODEL}.sequence_parallel=false, or {path}=1",
            )
        )
    return problems


def rule_automodel_sequence_parallel(recipe: Recipe) -> list[Problem]:
    """Sequence parallelism splits activations across tensor-parallel ranks
    (``hpcrl.core.backends.automodel.parallelize.apply_tp``): with tensor_parallel_size 1
    there is nothing to split and NeMo RL ignores it with a warning, as hpcrl does."""
    cfg = recipe.policy.automodel_cfg
    if not cfg.enabled or not cfg.sequence_parallel or cfg.tensor_parallel_size != 1:
        return []
    path = f"{AUTOMODEL}.sequence_parallel"
    return [
        Problem(
            path=path,
            value=True,
            message="has no effect with tensor_parallel_size 1 (no activations to split "
            "across tensor-parallel ranks; NeMo RL ignores it too)",
            fix=f"set {path}=false to silence this",
            severity="warning",
        )
    ]


def rule_megatron_custom_fsdp(recipe: Recipe) -> list[Problem]:
    """The Megatron worker builds megatron-core's DDP only (and refuses FSDP at setup)."""
    ddp = recipe.policy.megatron_cfg.distributed_data_parallel_config
    if not recipe.policy.megatron_cfg.enabled or not ddp.use_custom_fsdp:
        return []
    return [
        Problem(
            path="policy.megatron_cfg.distributed_data_parallel_config.use_custom_fsdp",
            value=True,
            message="Megatron FSDP is not supported by hpcrl's Megatron backend yet",
            fix="set it to false; policy.megatron_cfg.optimizer.use_distributed_optimizer=true "
            "shards the optimizer state over data-parallel ranks",
        )
    ]


def rule_batch_divisible(recipe: Recipe) -> list[Problem]:
    policy = recipe.policy
    global_batch, micro_batch = policy.train_global_batch_size, policy.train_micro_batch_size
    if global_batch < 1 or micro_batch < 1:
        return []  # the fields' own bounds report it (rule_field_bounds)
    problems = []
    if global_batch % micro_batch:
        problems.append(
            Problem(
                path="policy.train_global_batch_size",
                value=global_batch,
                message=f"not divisible by policy.train_micro_batch_size ({micro_batch}): gradients accumulate over whole micro-batches",
                fix=f"set policy.train_global_batch_size to a multiple of {micro_batch}, e.g. {_round_up(global_batch, micro_batch)}",
            )
        )
    if recipe.grpo is not None:
        problems += _grpo_rollouts_divisible(recipe, global_batch)
    return problems


def _grpo_rollouts_divisible(recipe: Recipe, global_batch: int) -> list[Problem]:
    grpo = recipe.grpo
    assert grpo is not None
    rollouts = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
    if rollouts < 1 or rollouts % global_batch == 0:
        return []
    return [
        Problem(
            path="policy.train_global_batch_size",
            value=global_batch,
            message=(
                f"must divide the rollouts of one GRPO step: grpo.num_prompts_per_step ({grpo.num_prompts_per_step}) × "
                f"grpo.num_generations_per_prompt ({grpo.num_generations_per_prompt}) = {rollouts}"
            ),
            fix=f"set policy.train_global_batch_size={rollouts} (one optimizer step per GRPO step) or another divisor of {rollouts}",
        )
    ]


def rule_grpo_settings(recipe: Recipe) -> list[Problem]:
    if recipe.grpo is None:
        return []
    problems = []
    grpo = recipe.grpo
    if grpo.use_leave_one_out_baseline and grpo.num_generations_per_prompt == 1:
        problems.append(
            Problem(
                path="grpo.num_generations_per_prompt",
                value=grpo.num_generations_per_prompt,
                message="the leave-one-out baseline needs at least 2 generations per prompt",
                fix="set grpo.num_generations_per_prompt=2 or more, or grpo.use_leave_one_out_baseline=false",
            )
        )
    return problems


def rule_async_grpo(recipe: Recipe) -> list[Problem]:
    if async_grpo_settings(recipe) is None:
        return []
    # NeMo RL's single controller (async_rl) trains without the correction when told to;
    # its grpo.async_grpo loop refuses to.
    nemo_rl_sc = recipe.async_rl is not None
    off = (
        "async_rl.sampler.max_lookahead_versions=0 (with async_rl.sampler.name=in_order)"
        if nemo_rl_sc
        else "grpo.async_grpo.enabled=false"
    )
    problems = []
    if not nemo_rl_sc and not recipe.loss_fn.use_importance_sampling_correction:
        problems.append(
            Problem(
                path="loss_fn.use_importance_sampling_correction",
                value=False,
                message="async GRPO trains on rollouts from an older policy; without the correction the gradient is biased",
                fix=f"set loss_fn.use_importance_sampling_correction=true or {off}",
            )
        )
    generation = recipe.policy.generation
    if generation.backend != "vllm" or generation.colocated.enabled:
        # Overlap needs an engine that samples while the trainer trains: separate workers.
        bad_path, bad_value = (
            ("policy.generation.backend", generation.backend)
            if generation.backend != "vllm"
            else ("policy.generation.colocated.enabled", True)
        )
        problems.append(
            Problem(
                path=bad_path,
                value=bad_value,
                message=_async_generation_message(generation.backend),
                fix=f"set policy.generation.backend=vllm and policy.generation.colocated.enabled=false (with its resources), or {off}",
            )
        )
    return problems


def _async_generation_message(backend: str) -> str:
    own_workers = (
        "async GRPO samples the next batches on vLLM generation workers of their own while "
        "the trainer trains"
    )
    if backend != "megatron":
        return own_workers
    # NeMo RL's trajectory collector treats Megatron inference as an async engine: rollouts
    # for later steps run between train steps on the same workers, weights updated in flight.
    return (
        "NeMo RL runs async GRPO with the Megatron policy generating (its trajectory "
        "collector takes rollouts for later steps from the colocated Megatron inference "
        "engine between train steps, updating its weights in flight); hpcrl does not support "
        f"that yet: {own_workers}"
    )


def rule_vllm_sizes(recipe: Recipe) -> list[Problem]:
    """vLLM's engine settings, checked while vLLM generates (others ignore them)."""
    generation = recipe.policy.generation
    problems: list[Problem] = []
    if generation.backend != "vllm":
        return problems
    vllm = generation.vllm_cfg
    if not 0.0 < vllm.gpu_memory_utilization <= 1.0:
        problems.append(
            Problem(
                path="policy.generation.vllm_cfg.gpu_memory_utilization",
                value=vllm.gpu_memory_utilization,
                message="must be in (0, 1]",
                fix="e.g. 0.6 when colocated with training",
            )
        )
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(vllm, name) < 1:
            problems.append(
                Problem(
                    path=f"policy.generation.vllm_cfg.{name}",
                    value=getattr(vllm, name),
                    message="must be at least 1",
                    fix=f"set policy.generation.vllm_cfg.{name}=1",
                )
            )
    return problems


#: vllm.LLM arguments hpcrl sets itself (hpcrl.core.generation.vllm_engine.engine_kwargs),
#: with the recipe key that sets each: policy.generation.vllm_kwargs may not give them.
RESERVED_VLLM_KWARGS = {
    "model": "policy.model_name",
    "dtype": "policy.generation.vllm_cfg.precision",
    "tensor_parallel_size": "policy.generation.vllm_cfg.tensor_parallel_size",
    "pipeline_parallel_size": "policy.generation.vllm_cfg.pipeline_parallel_size",
    "max_model_len": "policy.generation.vllm_cfg.max_model_len",
    "enforce_eager": "policy.generation.vllm_cfg.enforce_eager",
    "seed": "grpo.seed",
    "logprobs_mode": "nothing: hpcrl needs the sampler's processed log-probs",
    "disable_log_stats": "nothing: hpcrl reads vLLM's token counts",
    "gpu_memory_utilization": "policy.generation.vllm_cfg.gpu_memory_utilization",
    "enable_prefix_caching": "policy.generation.vllm_cfg.enable_prefix_caching",
    "hf_overrides": "policy.hf_config_overrides",
    # NeMo RL derives it from expert_parallel_size (a second value would be a duplicate
    # keyword to vllm.LLM there); through vllm_kwargs it would slip past that key's refusal.
    "enable_expert_parallel": "policy.generation.vllm_cfg.expert_parallel_size",
}


#: apply_chat_template arguments hpcrl sets itself (hpcrl.core.data.prompts.encode_prompt,
#: hpcrl.core.data.named._render): policy.tokenizer.chat_template_kwargs may not give them.
RESERVED_CHAT_TEMPLATE_KWARGS = ("conversation", "tokenize", "add_generation_prompt", "return_dict")


def rule_chat_template_kwargs(recipe: Recipe) -> list[Problem]:
    """``chat_template_kwargs`` reach every apply_chat_template call, except what hpcrl sets."""
    return [
        Problem(
            path=f"policy.tokenizer.chat_template_kwargs.{name}",
            value=value,
            message="hpcrl sets this apply_chat_template argument itself (the messages, "
            "token ids or text, and the generation prompt per data set)",
            fix="remove it (data.add_generation_prompt decides the generation prompt of SFT)"
            if name == "add_generation_prompt"
            else "remove it",
        )
        for name, value in sorted(recipe.policy.tokenizer.chat_template_kwargs.items())
        if name in RESERVED_CHAT_TEMPLATE_KWARGS
    ]


def rule_vllm_kwargs(recipe: Recipe) -> list[Problem]:
    """``vllm_kwargs`` go to ``vllm.LLM`` as they are, except what hpcrl sets itself."""
    return [
        Problem(
            path=f"policy.generation.vllm_kwargs.{name}",
            value=value,
            message="hpcrl sets this vLLM engine argument itself",
            fix=f"remove it; set {RESERVED_VLLM_KWARGS[name]} instead"
            if "nothing" not in RESERVED_VLLM_KWARGS[name]
            else f"remove it ({RESERVED_VLLM_KWARGS[name]})",
        )
        for name, value in sorted(recipe.policy.generation.vllm_kwargs.items())
        if name in RESERVED_VLLM_KWARGS
    ] + _kv_cache_given_twice(recipe)


def _kv_cache_given_twice(recipe: Recipe) -> list[Problem]:
    generation = recipe.policy.generation
    if "kv_cache_memory_bytes" not in generation.vllm_kwargs:
        return []
    if generation.vllm_cfg.kv_cache_memory_mb is None:
        return []
    return [
        Problem(
            path="policy.generation.vllm_kwargs.kv_cache_memory_bytes",
            value=generation.vllm_kwargs["kv_cache_memory_bytes"],
            message="policy.generation.vllm_cfg.kv_cache_memory_mb sets the KV cache size too",
            fix="keep one of the two",
        )
    ]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


RECIPE_RULES = (
    rule_one_backend,
    rule_one_algorithm,
    rule_unsupported_sections,
    rule_automodel_sequence_parallel,
    rule_megatron_custom_fsdp,
    rule_batch_divisible,
    rule_grpo_settings,
    rule_async_grpo,
    *ASYNC_RL_RULES,
    rule_vllm_sizes,
    rule_vllm_kwargs,
    rule_chat_template_kwargs,
    *REWARD_MODEL_RULES,
    rule_node_split,
    *GENERATION_RULES,
    rule_automodel_context_parallel,
    *LOSS_RULES,
    *LORA_RULES,
    *MEGATRON_RULES,
    *OVERRIDE_RULES,
    *OPTIMIZER_RULES,
    *BATCHING_RULES,
    *GRPO_OPTION_RULES,
    *FUSED_LOGPROBS_RULES,
    *ADVANTAGE_RULES,
    *DATA_RULES,
    rule_field_bounds,
    *RANGE_RULES,
    *ENV_RULES,
    *CHECKPOINT_METRIC_RULES,
    rule_save_deadline,
)
