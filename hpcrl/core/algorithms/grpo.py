"""GRPO: sample groups of responses per prompt, score them, push up the better ones.

One step: prompts from the data → ``num_generations_per_prompt`` samples each
(``policy.generate``) → rewards from the environment → group advantages → old-policy (and,
with a KL penalty, reference) log-probs → clipped policy-gradient training, in optimizer
steps of ``policy.train_global_batch_size`` rollouts. Only the ``Policy`` interface is used.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hpcrl.config.recipe import GenerationCfg, Recipe
from hpcrl.core.algorithms.advantages import group_advantages
from hpcrl.core.algorithms.loop import StepTimer, generation_seed
from hpcrl.core.algorithms.losses import grpo_loss
from hpcrl.core.algorithms.reward_terms import shape_rewards
from hpcrl.core.data.jsonl import EpochSampler
from hpcrl.core.data.prompts import encode_prompt, truncate_left
from hpcrl.core.policy import GenerationOutput, Policy


@attrs.frozen(kw_only=True)
class Rollouts:
    """One step's samples, flat: ``num_generations`` consecutive rows per prompt."""

    prompts: list[str]
    answers: list[str]
    responses: list[str]
    rewards: Any  # torch.Tensor [N]
    generation: GenerationOutput
    truncated: Any  # torch.Tensor [N] bool: stopped by max_new_tokens, not by a stop


def prompt_token_budget(recipe: Recipe) -> int:
    """Prompt tokens that leave room for max_new_tokens within max_total_sequence_length."""
    policy = recipe.policy
    budget = policy.max_total_sequence_length - policy.generation.max_new_tokens
    if recipe.data.max_input_seq_length is not None:
        budget = min(budget, recipe.data.max_input_seq_length)
    if budget < 1:
        raise ValueError(
            f"policy.generation.max_new_tokens ({policy.generation.max_new_tokens}) leaves no room "
            f"for the prompt in policy.max_total_sequence_length ({policy.max_total_sequence_length})"
        )
    return budget


def expand_prompts(
    recipe: Recipe, tokenizer: Any, rows: Sequence[dict]
) -> tuple[list[str], list[str], list[list[int]]]:
    """``num_generations_per_prompt`` consecutive copies of each row: texts, answers, ids."""
    grpo, data = recipe.grpo, recipe.data
    assert grpo is not None
    budget = prompt_token_budget(recipe)
    use_chat = recipe.policy.tokenizer.chat_template is not None
    prompts, answers, prompt_ids = [], [], []
    for row in rows:
        # Rows of NeMo RL's named sets arrive tokenized by their processor.
        encoded = row.get("prompt_ids") or encode_prompt(
            tokenizer, str(row[data.prompt_key]), use_chat
        )
        ids = truncate_left(encoded, budget)
        for _ in range(grpo.num_generations_per_prompt):
            prompts.append(str(row[data.prompt_key]))
            answers.append(str(row.get(data.answer_key, "")))
            prompt_ids.append(ids)
    return prompts, answers, prompt_ids


def sample_rollouts(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, rows: Sequence[dict], step: int
) -> Rollouts:
    """Generate ``num_generations_per_prompt`` responses per row and score them."""
    import torch

    grpo = recipe.grpo
    assert grpo is not None
    prompts, answers, prompt_ids = expand_prompts(recipe, tokenizer, rows)
    policy.prepare_for_generation()
    generation = policy.generate(
        prompt_ids, recipe.policy.generation, generation_seed(grpo.seed, step)
    )
    policy.prepare_for_training()
    responses = decode_responses(tokenizer, generation)
    rewards = torch.tensor(env.score(prompts, responses, answers), dtype=torch.float32)
    rewards = shape_rewards(recipe, rewards, generation.response_lengths)
    return Rollouts(
        prompts=prompts,
        answers=answers,
        responses=responses,
        rewards=rewards,
        generation=generation,
        truncated=truncated_responses(
            generation, recipe.policy.generation, tokenizer.eos_token_id, responses
        ),
    )


def truncated_responses(
    generation: GenerationOutput,
    cfg: GenerationCfg,
    eos_token_id: int | None,
    responses: Sequence[str],
) -> Any:
    """[N] bool: the response used all max_new_tokens and does not end in a stop token id
    (EOS, stop_token_ids) nor contain a stop string, i.e. it was cut off (NeMo RL's
    ``truncated``, what ``grpo.overlong_filtering`` leaves out of the loss)."""
    import torch

    stop_ids = set(cfg.stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
    flags = []
    for row, text in enumerate(responses):
        length = int(generation.response_lengths[row])
        end = int(generation.prompt_lengths[row]) + length
        last = int(generation.input_ids[row, end - 1]) if length else None
        stopped = last in stop_ids or any(stop in text for stop in cfg.stop_strings)
        flags.append(length >= cfg.max_new_tokens and not stopped)
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
    """The batch the loss reads (see hpcrl.core.algorithms.losses), minus log-probs."""
    import torch

    grpo = recipe.grpo
    assert grpo is not None
    generation = rollouts.generation
    advantages = group_advantages(
        rollouts.rewards,
        grpo.num_generations_per_prompt,
        normalize=grpo.normalize_rewards,
        leave_one_out=grpo.use_leave_one_out_baseline,
    )
    sample_mask = torch.ones(generation.input_ids.shape[0], dtype=torch.float32)
    if grpo.overlong_filtering:
        # After the advantages: truncated responses still count in their group's baseline.
        sample_mask = (~rollouts.truncated).to(torch.float32)
    return {
        "input_ids": generation.input_ids,
        "attention_mask": generation.attention_mask,
        "token_mask": generation.response_mask.to(torch.float32) * sample_mask[:, None],
        "sample_mask": sample_mask,
        "generation_logprobs": generation.generation_logprobs.to(torch.float32),
        "advantages": advantages,
    }


def add_logprobs(policy: Policy, recipe: Recipe, batch: dict[str, Any]) -> None:
    batch["old_logprobs"] = policy.get_logprobs(batch)
    if recipe.loss_fn.reference_policy_kl_penalty != 0:
        batch["ref_logprobs"] = policy.get_reference_logprobs(batch)


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
    """Optimizer steps over chunks of train_global_batch_size rollouts; metrics averaged."""
    size = batch["input_ids"].shape[0]
    chunk = recipe.policy.train_global_batch_size
    if size % chunk != 0:
        raise ValueError(
            f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt = {size} rollouts is "
            f"not a multiple of policy.train_global_batch_size ({chunk}); make it one"
        )
    loss_fn = functools.partial(grpo_loss, cfg=recipe.loss_fn)
    results = [policy.train(part, loss_fn) for part in global_batch_chunks(batch, chunk)]
    return {key: sum(r[key] for r in results) / len(results) for key in results[0]}


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
    with timer.phase("train"):
        train_metrics = train_on_batch(policy, recipe, batch)
    step_s = time.perf_counter() - started
    return {
        "step": step,
        **train_metrics,
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
        grpo.num_prompts_per_step,
        grpo.num_generations_per_prompt,
        grpo.dynamic_sampling_max_gen_batches,
    )


def rollout_metrics(rollouts: Rollouts, step_s: float, generate_s: float) -> dict[str, float]:
    """Reward, length and throughput figures of one step's rollouts (sync and async GRPO),
    plus the engines' own figures (refit, prefill and decode times, decode steps, ...)."""
    generation = rollouts.generation
    num_tokens = int(generation.attention_mask.sum())
    metrics = {
        **{key: float(value) for key, value in generation.metrics.items()},
        "truncated_fraction": float(rollouts.truncated.float().mean()),
        "reward_mean": float(rollouts.rewards.mean()),
        "reward_std": float(rollouts.rewards.std()) if len(rollouts.rewards) > 1 else 0.0,
        "response_length_mean": float(generation.response_lengths.float().mean()),
        "num_tokens": num_tokens,
        "tokens_per_s": num_tokens / step_s,
        "generated_tokens_per_s": float(generation.response_lengths.sum()) / max(generate_s, 1e-9),
        "time_step_s": step_s,
    }
    if generation.engine_generated_tokens is not None:  # an engine (vLLM) sampled them
        metrics["engine_generated_tokens"] = int(generation.engine_generated_tokens.sum())
    return metrics


StepFn = Callable[[int], dict[str, Any]]


def make_grpo_step_fn(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, sampler: EpochSampler
) -> StepFn:
    return functools.partial(grpo_step, policy, recipe, tokenizer, env, sampler)
