"""Rank function of the Megatron packing test (spawned ranks import it by module path):
the same mixed-length batch through megatron's schedule as fixed micro-batches, dynamic
micro-batches and THD packs — log-probs, loss and every gradient compared."""

from __future__ import annotations

from tests.megatron import harness
from tests.recipe_builder import tiny_megatron_recipe


def mixed_batch(rows: int, width: int, seed: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (rows,), generator=generator).tolist()
    input_ids = torch.randint(4, 100, (rows, width), generator=generator)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    token_mask = torch.zeros(rows, width)
    for row, length in enumerate(lengths):
        attention_mask[row, :length] = 1
        token_mask[row, 2:length] = 1.0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_mask": token_mask}


def _grads(worker) -> dict:
    grads = {}
    for chunk in worker.model_chunks:
        for name, param in chunk.named_parameters():
            grad = getattr(param, "main_grad", None)
            grads[name] = (grad if grad is not None else param.grad).detach().clone()
    return grads


def packing_run(rank: int, world_size: int, hf_path: str, ckpt_root: str) -> dict:
    """Per way: log-probs of the batch, the summed loss and the gradients (no step taken)."""
    from hpcrl.core.backends.megatron import step
    from hpcrl.core.workers.micro_batches import (
        BatchingSettings,
        materialize,
        plan_shards,
        row_lengths,
    )

    recipe = tiny_megatron_recipe(hf_path, dist_opt=False)
    worker, _ = harness.setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    batch = mixed_batch(8, harness.SEQ_LEN, seed=3)
    tokens = float(batch["token_mask"].sum())
    ways = {
        "fixed": BatchingSettings(rows_per_micro_batch=2),
        "dynamic": BatchingSettings(mode="dynamic", tokens_per_micro_batch=48, round_to=4),
        "packed": BatchingSettings(mode="packed", tokens_per_micro_batch=40, divisible_by=2),
    }
    out = {}
    for name, settings in ways.items():
        plan = plan_shards([row_lengths(batch)], harness.SEQ_LEN, settings)[0]
        micro = [materialize(batch, spec) for spec in plan]
        logprobs = worker.logprobs(batch, plan)
        for chunk in worker.model_chunks:
            chunk.zero_grad_buffer()
        metrics = step.run_train_microbatches(
            worker.model_chunks, micro, harness.masked_nll, tokens
        )
        out[name] = {
            "logprobs": logprobs * batch["attention_mask"],
            "loss": metrics["loss"],
            "grads": _grads(worker),
            "num_micro_batches": len(plan),
        }
    worker.close()
    return out
