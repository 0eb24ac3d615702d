"""Rank function of the Megatron context-parallel test (spawned ranks import it by module
path): log-probs of a mixed-length batch unpacked and packed, then one training step of each
through the real ``MegatronWorker.train_step``, at any ``context_parallel_size``."""

from __future__ import annotations

from tests.megatron import harness
from tests.megatron.packing_ranks import mixed_batch
from tests.recipe_builder import tiny_megatron_recipe

# Sequences padded to multiples of 4 and packs of at most 40 tokens: 2 x CP for CP = 2.
PACKING = {"mode": "packed", "tokens_per_micro_batch": 40, "divisible_by": 4, "round_to": 4}


def _weights(worker) -> dict:
    return {
        name: param.detach().clone()
        for chunk in worker.model_chunks
        for name, param in chunk.named_parameters()
    }


def cp_run(rank: int, world_size: int, hf_path: str, ckpt_root: str, cp: int) -> dict:
    """{logprobs_unpacked, logprobs_packed, steps: [unpacked, packed metrics], logprobs_after,
    weights} of this rank's DP shard; log-probs real on its reporting rank (zeros elsewhere,
    as the worker returns them)."""
    from hpcrl.core.workers.micro_batches import (
        BatchingSettings,
        materialize,
        plan_shards,
        row_lengths,
    )

    recipe = tiny_megatron_recipe(hf_path, cp=cp)
    worker, place = harness.setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    whole = mixed_batch(8, harness.SEQ_LEN, seed=5)
    tokens = float(whole["token_mask"].sum())
    batch = harness.shard(whole, place)  # this DP rank's rows (all of them at DP 1)
    plans = {
        way: plan_shards([row_lengths(batch)], harness.SEQ_LEN, settings)[0]
        for way, settings in (
            ("unpacked", BatchingSettings(rows_per_micro_batch=2)),
            ("packed", BatchingSettings(**PACKING)),
        )
    }
    out: dict = {"place": (place.dp_rank, place.dp_size, place.returns_results)}
    for way, plan in plans.items():
        out[f"logprobs_{way}"] = worker.logprobs(batch, plan) * batch["attention_mask"]
    out["steps"] = [
        worker.train_step([materialize(batch, spec) for spec in plan], harness.masked_nll, tokens)
        for plan in plans.values()
    ]
    out["logprobs_after"] = worker.logprobs(batch, plans["unpacked"]) * batch["attention_mask"]
    out["weights"] = _weights(worker)
    out["num_packs"] = len(plans["packed"])
    worker.close()
    return out
