"""SFT: masked cross-entropy on prompt/response pairs, one optimizer step per global batch."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from hpcrl.config.recipe import Recipe
from hpcrl.core.algorithms.loop import StepTimer
from hpcrl.core.algorithms.losses import sft_loss
from hpcrl.core.data.jsonl import EpochSampler
from hpcrl.core.data.prompts import encode_sft_example
from hpcrl.core.policy import Policy


def build_sft_batch(recipe: Recipe, tokenizer: Any, rows: Sequence[dict]) -> dict[str, Any]:
    """Right-padded input_ids / attention_mask / token_mask (response tokens + EOS)."""
    import torch

    data = recipe.data
    use_chat = recipe.policy.tokenizer.chat_template is not None
    examples = [
        # Rows of NeMo RL's named sets arrive tokenized by the SFT processor.
        (row["input_ids"], row["token_mask"])
        if "input_ids" in row
        else encode_sft_example(
            tokenizer,
            str(row[data.prompt_key]),
            str(row[data.response_key]),
            recipe.policy.max_total_sequence_length,
            use_chat,
            recipe.policy.tokenizer.chat_template_kwargs,
        )
        for row in rows
    ]
    width = max(len(ids) for ids, _ in examples)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    token_mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for row, (ids, mask) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        token_mask[row, : len(mask)] = torch.tensor(mask)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_mask": token_mask}


def sft_step(
    policy: Policy, recipe: Recipe, tokenizer: Any, sampler: EpochSampler, step: int
) -> dict[str, Any]:
    """One optimizer step on the next ``train_global_batch_size`` examples."""
    timer = StepTimer()
    started = time.perf_counter()
    rows = sampler.next_batch(recipe.policy.train_global_batch_size)
    batch = build_sft_batch(recipe, tokenizer, rows)
    with timer.phase("train"):
        metrics = policy.train(batch, sft_loss)
    step_s = time.perf_counter() - started
    num_tokens = int(batch["attention_mask"].sum())
    return {
        "step": step,
        **metrics,
        "num_tokens": num_tokens,
        "num_loss_tokens": int(batch["token_mask"].sum()),
        "tokens_per_s": num_tokens / step_s,
        "time_step_s": step_s,
        **timer.as_metrics(),
    }


def make_sft_step_fn(policy: Policy, recipe: Recipe, tokenizer: Any, sampler: EpochSampler):
    return functools.partial(sft_step, policy, recipe, tokenizer, sampler)
