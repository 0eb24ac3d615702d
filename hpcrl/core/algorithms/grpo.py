"""GRPO: sample groups of responses per prompt, score them, push up the better ones.

One step, in NeMo RL's order (docs/algorithms.md): prompts from the data, fitted to
``data.max_input_seq_length`` → ``num_generations_per_prompt`` samples each
(``policy.generate``) → rewards from the environment, scaled and shaped → old-policy (and,
with a KL penalty, reference) log-probs → sequence-level log-prob error masking → advantages
over groups of equal prompts → clipped policy-gradient training, in optimizer steps of
``policy.train_global_batch_size`` rollouts. Only the ``Policy`` interface is used.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hpcrl.config.recipe import GenerationCfg, Recipe
from hpcrl.core.algorithms.advantages import estimate_advantages, prompt_groups
from hpcrl.core.algorithms.loop import StepTimer, generation_seed
from hpcrl.core.algorithms.losses import grpo_loss
from hpcrl.core.algorithms.reward_terms import shape_rewards
from hpcrl.core.algorithms.sequence_masking import mask_by_sequence_logprob_error
from hpcrl.core.data.jsonl import EpochSampler
from hpcrl.core.data.prompts import encode_prompt, fit_prompt, prompt_key, prompt_length_limit
from hpcrl.core.metric_reduction import combine_optimizer_steps
from hpcrl.core.policy import GenerationOutput, Policy


@attrs.frozen(kw_only=True)
class PromptBatch:
    """One step's prompts, flat: ``num_generations_per_prompt`` consecutive rows per data row."""

    prompts: list[str]
    answers: list[str]
    prompt_ids: list[list[int]]
    # 0 where the prompt did not fit and was cut to a stub (hpcrl.core.data.prompts.fit_prompt)
    loss_multiplier: list[float]


@attrs.frozen(kw_only=True)
class Rollouts:
    """One step's samples, flat (the rows of ``PromptBatch``, in its order)."""

    prompts: list[str]
    answers: list[str]
    responses: list[str]
    rewards: Any  # torch.Tensor [N]: scaled and shaped, what the advantages are computed from
    unshaped_rewards: Any  # torch.Tensor [N]: scaled, not shaped (dynamic sampling's filter)
    generation: GenerationOutput
    truncated: Any  # torch.Tensor [N] bool: stopped by the length limit, not by a stop
    loss_multiplier: Any  # torch.Tensor [N] float: 0 = generated and scored, never trained on
    # Each row's prompt token ids without trailing pad tokens: equal keys, one advantage group.
    prompt_keys: list[tuple[int, ...]]
    # A multi-reward environment's named rewards (scaled, not shaped), for gdpo: [N, K]
    # columns in the order of the names; K = 0 for a one-reward environment.
    reward_components: Any = None
    reward_component_names: tuple[str, ...] = ()
    # the environment's own figures of this batch (the reward model's reward_model_env/*)
    env_metrics: dict[str, float] = attrs.field(factory=dict)

    def components(self) -> dict[str, Any]:
        """The named reward components, [N] each ({} for a one-reward environment)."""
        names = self.reward_component_names
        return {name: self.reward_components[:, k] for k, name in enumerate(names)}


def context_length(recipe: Recipe) -> int:
    """Tokens a sequence may hold in the generation engine (vLLM's ``max_model_len`` where
    set, else ``policy.max_total_sequence_length``): what a prompt must leave room in, and what
    caps each response."""
    generation = recipe.policy.generation
    if generation.backend == "vllm" and generation.vllm_cfg.max_model_len is not None:
        return generation.vllm_cfg.max_model_len
    return recipe.policy.max_total_sequence_length


def expand_prompts(recipe: Recipe, tokenizer: Any, rows: Sequence[dict]) -> PromptBatch:
    """``num_generations_per_prompt`` consecutive copies of each row, its prompt fitted to
    ``data.max_input_seq_length`` as NeMo RL does (``fit_prompt``)."""
    grpo, data = recipe.grpo, recipe.data
    assert grpo is not None
    limit = prompt_length_limit(data.max_input_seq_length, context_length(recipe))
    use_chat = recipe.policy.tokenizer.chat_template is not None
    fitted = []
    for row in rows:
        # Rows of NeMo RL's named sets arrive tokenized by their processor.
        encoded = row.get("prompt_ids") or encode_prompt(
            tokenizer,
            str(row[data.prompt_key]),
            use_chat,
            recipe.policy.tokenizer.chat_template_kwargs,
        )
        fitted.append((row, *fit_prompt(encoded, limit)))
    copies = [item for item in fitted for _ in range(grpo.num_generations_per_prompt)]
    return PromptBatch(
        prompts=[str(row[data.prompt_key]) for row, _, _ in copies],
        answers=[str(row.get(data.answer_key, "")) for row, _, _ in copies],
        prompt_ids=[ids for _, ids, _ in copies],
        loss_multiplier=[multiplier for _, _, multiplier in copies],
    )


def sample_rollouts(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, rows: Sequence[dict], step: int
) -> Rollouts:
    """Generate ``num_generations_per_prompt`` responses per row and score them."""
    grpo = recipe.grpo
    assert grpo is not None
    prompts = expand_prompts(recipe, tokenizer, rows)
    policy.prepare_for_generation()
    generation = policy.generate(
        prompts.prompt_ids, recipe.policy.generation, generation_seed(grpo.seed, step)
    )
    policy.prepare_for_training()
    return score_rollouts(recipe, tokenizer, env, prompts, generation)


def score_rollouts(
    recipe: Recipe, tokenizer: Any, env: Any, prompts: PromptBatch, generation: GenerationOutput
) -> Rollouts:
    """Decode, score (environment, then reward scaling and shaping) and flag truncation."""
    import torch

    responses = decode_responses(tokenizer, generation)
    truncated = truncated_responses(
        generation,
        recipe.policy.generation,
        tokenizer.eos_token_id,
        responses,
        context_length(recipe),
    )
    scores, names, components = score_responses(recipe, env, prompts, responses)
    shaped = shape_rewards(recipe, scores, generation.response_lengths, truncated)
    pad = getattr(tokenizer, "pad_token_id", None)
    return Rollouts(
        reward_components=components,
        reward_component_names=names,
        prompts=prompts.prompts,
        answers=prompts.answers,
        responses=responses,
        rewards=shaped.rewards,
        unshaped_rewards=shaped.unshaped,
        generation=generation,
        truncated=truncated,
        loss_multiplier=torch.tensor(prompts.loss_multiplier, dtype=torch.float32),
        prompt_keys=[prompt_key(ids, pad) for ids in prompts.prompt_ids],
        env_metrics=dict(getattr(env, "last_metrics", {})),
    )


def score_responses(
    recipe: Recipe, env: Any, prompts: PromptBatch, responses: Sequence[str]
) -> tuple[Any, tuple[str, ...], Any]:
    """(rewards [N], component names, components [N, K]) from the environment. A
    multi-reward environment (``score_components``) gives each response the sum of its
    components, as NeMo RL's rollout does; the components are scaled as the reward is
    (``grpo.reward_scaling``, NeMo RL's ``scale_rewards``), never shaped."""
    import torch

    from hpcrl.core.algorithms.reward_terms import scale_rewards

    if not hasattr(env, "score_components"):
        scores = env.score(prompts.prompts, responses, prompts.answers)
        return torch.tensor(scores, dtype=torch.float32), (), torch.zeros(len(scores), 0)
    named = env.score_components(prompts.prompts, responses, prompts.answers)
    names = tuple(sorted(named))
    raw = torch.tensor([named[name] for name in names], dtype=torch.float32).T
    assert recipe.grpo is not None
    return raw.sum(dim=1), names, scale_rewards(raw, recipe.grpo.reward_scaling)


def truncated_responses(
    generation: GenerationOutput,
    cfg: GenerationCfg,
    eos_token_id: int | None,
    responses: Sequence[str],
    context: int | None = None,
) -> Any:
    """[N] bool: the response used all the tokens it could (max_new_tokens, or what its
    prompt left of the engine's ``context``) and does not end in a stop token id (EOS,
    stop_token_ids) nor contain a stop string, i.e. it was cut off (NeMo RL's
    ``truncated``, what ``grpo.overlong_filtering`` leaves out of the loss)."""
    import torch

    stop_ids = set(cfg.stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
    flags = []
    for row, text in enumerate(responses):
        length = int(generation.response_lengths[row])
        start = int(generation.prompt_lengths[row])
        limit = cfg.max_new_tokens
        if context is not None:
            limit = min(limit, context - start)
        last = int(generation.input_ids[row, start + length - 1]) if length else None
        stopped = last in stop_ids or any(stop in text for stop in cfg.stop_strings)
        flags.append(length >= limit and not stopped)
    return torch.tensor(flags, dtype=torch.bool)


def decode_responses(tokenizer: Any, generation: GenerationOutput) -> list[str]:
    texts = []
    for row in range(generation.input_ids.shape[0]):
        start = int(generation.prompt_lengths[row])
        end = start + int(generation.response_lengths[row])
        ids = generation.input_ids[row, start:end].tolist()
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return texts


def build_train_batch(recipe: Recipe, rollouts: Rollouts) -> dict[str, Any]:
    """The batch the loss reads (see hpcrl.core.algorithms.losses) without log-probs and
    advantages (``finish_train_batch`` adds those). ``sample_mask`` is NeMo RL's
    ``loss_multiplier``: 0 for a prompt that did not fit, and with ``grpo.overlong_filtering``
    for a truncated response; such rows still count in their group's baseline."""
    import torch

    grpo = recipe.grpo
    assert grpo is not None
    generation = rollouts.generation
    sample_mask = rollouts.loss_multiplier.to(torch.float32).clone()
    if grpo.overlong_filtering:
        sample_mask = sample_mask * (~rollouts.truncated).to(torch.float32)
    return {
        "input_ids": generation.input_ids,
        "attention_mask": generation.attention_mask,
        "token_mask": generation.response_mask.to(torch.float32) * sample_mask[:, None],
        "sample_mask": sample_mask,
        "generation_logprobs": generation.generation_logprobs.to(torch.float32),
    }


def add_logprobs(policy: Policy, recipe: Recipe, batch: dict[str, Any]) -> None:
    batch["old_logprobs"] = policy.get_logprobs(batch)
    if recipe.loss_fn.reference_policy_kl_penalty != 0:
        batch["ref_logprobs"] = policy.get_reference_logprobs(batch)


def finish_train_batch(
    recipe: Recipe, rollouts: Rollouts, batch: dict[str, Any]
) -> dict[str, float]:
    """After the old log-probs, as NeMo RL orders it: leave sequences the sampler and the
    trainer disagree on out of the loss (``grpo.seq_logprob_error_threshold``; its metrics
    always), then the advantages (``grpo.adv_estimator``, groups by prompt content,
    clipped). Returns the step's sequence-error metrics."""
    grpo = recipe.grpo
    assert grpo is not None
    metrics = mask_by_sequence_logprob_error(
        batch, rollouts.rewards, grpo.seq_logprob_error_threshold
    )
    groups = prompt_groups(rollouts.prompt_keys)
    batch["advantages"] = estimate_advantages(
        grpo, rollouts.rewards, groups, batch["token_mask"], rollouts.components()
    )
    return metrics


def global_batch_chunks(batch: dict[str, Any], chunk: int) -> list[dict[str, Any]]:
    """Optimizer-step batches of ``chunk`` rollouts, each with ``num_global_sequences``: the
    number of its sequences that count (sample_mask), at least 1."""
    import torch

    chunks = []
    for start in range(0, batch["input_ids"].shape[0], chunk):
        part = {key: value[start : start + chunk] for key, value in batch.items()}
        counted = max(float(part["sample_mask"].sum()), 1.0)
        part["num_global_sequences"] = torch.full((len(part["sample_mask"]),), counted)
        chunks.append(part)
    return chunks


def train_on_batch(policy: Policy, recipe: Recipe, batch: dict[str, Any]) -> dict[str, float]:
    """Optimizer steps over chunks of train_global_batch_size rollouts; metrics averaged
    over them (extrema: min/max, hpcrl.core.metric_reduction)."""
    size = batch["input_ids"].shape[0]
    chunk = recipe.policy.train_global_batch_size
    if size % chunk != 0:
        raise ValueError(
            f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt = {size} rollouts is "
            f"not a multiple of policy.train_global_batch_size ({chunk}); make it one"
        )
    loss_fn = functools.partial(grpo_loss, cfg=recipe.loss_fn)
    results = [policy.train(part, loss_fn) for part in global_batch_chunks(batch, chunk)]
    return combine_optimizer_steps(results)


def grpo_step(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, sampler: EpochSampler, step: int
) -> dict[str, Any]:
    """One GRPO step; returns its metrics record."""
    assert recipe.grpo is not None
    timer = StepTimer()
    started = time.perf_counter()
    with timer.phase("generate"):
        rollouts, sampling_metrics = step_rollouts(policy, recipe, tokenizer, env, sampler, step)
    batch = build_train_batch(recipe, rollouts)
    with timer.phase("logprobs"):
        add_logprobs(policy, recipe, batch)
    sequence_metrics = finish_train_batch(recipe, rollouts, batch)
    with timer.phase("train"):
        train_metrics = train_on_batch(policy, recipe, batch)
    step_s = time.perf_counter() - started
    return {
        "step": step,
        **train_metrics,
        **sequence_metrics,
        **rollout_metrics(rollouts, step_s, timer.seconds["generate"]),
        **timer.as_metrics(),
        **sampling_metrics,
        "sample_response": rollouts.responses[0],
    }


def step_rollouts(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, sampler: EpochSampler, step: int
) -> tuple[Rollouts, dict[str, float]]:
    """One step's rollouts: one generation batch, or with ``grpo.use_dynamic_sampling`` as
    many as it takes to gather num_prompts_per_step groups whose rewards differ."""
    grpo = recipe.grpo
    assert grpo is not None
    if not grpo.use_dynamic_sampling:
        rows = sampler.next_batch(grpo.num_prompts_per_step)
        return sample_rollouts(policy, recipe, tokenizer, env, rows, step), {}
    from hpcrl.config.grpo_option_rules import generation_batch_prompts
    from hpcrl.core.algorithms.dynamic_sampling import sample_dynamically

    def one_batch(batch_index: int) -> Rollouts:
        rows = sampler.next_batch(generation_batch_prompts(grpo))
        # A distinct seed per extra batch, still a pure function of (seed, step, batch).
        return sample_rollouts(policy, recipe, tokenizer, env, rows, step + 1_000_000 * batch_index)

    return sample_dynamically(
        one_batch,
        grpo.num_prompts_per_step * grpo.num_generations_per_prompt,
        grpo.dynamic_sampling_max_gen_batches,
        leave_one_out=grpo.use_leave_one_out_baseline,
    )


def rollout_metrics(rollouts: Rollouts, step_s: float, generate_s: float) -> dict[str, float]:
    """Reward, length and throughput figures of one step's rollouts (sync and async GRPO),
    plus the engines' own figures (refit, prefill and decode times, decode steps, ...)."""
    generation = rollouts.generation
    num_tokens = int(generation.attention_mask.sum())
    metrics = {
        **{key: float(value) for key, value in generation.metrics.items()},
        "truncated_fraction": float(rollouts.truncated.float().mean()),
        # rollouts of prompts that did not fit data.max_input_seq_length (not trained on)
        "overlong_prompts": int((rollouts.loss_multiplier == 0).sum()),
        "reward_mean": float(rollouts.rewards.mean()),
        "reward_std": float(rollouts.rewards.std()) if len(rollouts.rewards) > 1 else 0.0,
        "response_length_mean": float(generation.response_lengths.float().mean()),
        "num_tokens": num_tokens,
        "tokens_per_s": num_tokens / step_s,
        "generated_tokens_per_s": float(generation.response_lengths.sum()) / max(generate_s, 1e-9),
        "time_step_s": step_s,
    }
    metrics.update(rollouts.env_metrics)  # the environment's own (reward_model_env/*)
    for name, values in rollouts.components().items():  # reward/format -> reward_format_mean
        metrics[f"{name.replace('/', '_')}_mean"] = float(values.mean())
    if generation.engine_generated_tokens is not None:  # an engine (vLLM) sampled them
        metrics["engine_generated_tokens"] = int(generation.engine_generated_tokens.sum())
    return metrics


StepFn = Callable[[int], dict[str, Any]]


def make_grpo_step_fn(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, sampler: EpochSampler
) -> StepFn:
    return functools.partial(grpo_step, policy, recipe, tokenizer, env, sampler)
