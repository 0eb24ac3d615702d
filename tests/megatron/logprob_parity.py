"""Rank function of the Megatron log-prob parity test (spawned children import it by path).

One MegatronWorker per rank (real megatron-core on gloo, CPU compatibility layer) scores a fixed
batch under several sampling distributions through all three of its log-prob paths: the
log-prob pass (``logprobs``: old log-probs), the reference pass (``reference_logprobs``:
temperature, no top-k/top-p) and the training forward (a probe loss sees what ``loss_fn``
gets, plus the unfiltered values under top-k/top-p). Each is compared, on the rank that
reports for its data-parallel shard, with ``tests/core/logprob_reference.py`` applied to
the logits of the plain HF model the checkpoint came from.
"""

from __future__ import annotations

from typing import Any

import attrs

from tests.megatron import harness
from tests.recipe_builder import tiny_megatron_recipe

GENERATIONS = {
    "t1": {"temperature": 1.0},
    "t0.7": {"temperature": 0.7},
    "t0.6_topk8_topp0.7": {"temperature": 0.6, "top_k": 8, "top_p": 0.7},
}


def max_gap(got, want) -> float:
    """Largest |got − want| where both are finite; inf when −inf positions disagree."""
    import torch

    if not torch.equal(torch.isfinite(got), torch.isfinite(want)):
        return float("inf")
    finite = torch.isfinite(want)
    return float((got[finite] - want[finite]).abs().max()) if finite.any() else 0.0


def parity_probe(logprobs, micro_batch, num_global_tokens):
    """A zero-gradient loss whose metrics are the train-path gaps to the expected values."""
    from hpcrl.core.policy import UNFILTERED_LOGPROBS_KEY

    mask = micro_batch["token_mask"].bool()
    gaps = {"train_gap": max_gap(logprobs.detach()[mask], micro_batch["expected"][mask])}
    unfiltered = micro_batch.get(UNFILTERED_LOGPROBS_KEY, logprobs).detach()
    gaps["train_unfiltered_gap"] = max_gap(
        unfiltered[mask], micro_batch["expected_unfiltered"][mask]
    )
    return (logprobs.sum() * 0.0), gaps


def grpo_recipe(hf_path: str, tp: int) -> Any:
    from hpcrl.config.recipe import GrpoCfg

    recipe = tiny_megatron_recipe(hf_path, tp=tp, lr=0.0)  # lr 0: weights stay the HF ones
    return attrs.evolve(recipe, sft=None, grpo=GrpoCfg(num_prompts_per_step=2))


def parity_run(rank: int, world_size: int, hf_path: str, ckpt_root: str, tp: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from hpcrl.config.recipe import GenerationCfg
    from hpcrl.core.token_distribution import TokenDistribution
    from tests.core.logprob_reference import reference_logprobs

    recipe = grpo_recipe(hf_path, tp)
    worker, place = harness.setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    batch = harness.fixed_batch()
    shard = harness.shard(batch, place)
    hf = AutoModelForCausalLM.from_pretrained(hf_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(input_ids=shard["input_ids"]).logits
    gaps: dict[str, dict[str, float]] = {}
    for name, kwargs in GENERATIONS.items():
        cfg = GenerationCfg(**kwargs)
        worker.distribution = TokenDistribution.of_generation(cfg)
        want = reference_logprobs(logits, shard["input_ids"], cfg)
        want_unfiltered = reference_logprobs(logits, shard["input_ids"], cfg, filtered=False)
        mask = shard["token_mask"].bool()
        old = worker.logprobs(shard)
        ref = worker.reference_logprobs(shard)
        probe_batch = {**shard, "expected": want, "expected_unfiltered": want_unfiltered}
        metrics = worker.train_step(
            harness.micro_batches(probe_batch, recipe.policy.train_micro_batch_size),
            parity_probe,
            float(batch["token_mask"].sum()),
        )
        gaps[name] = {
            "train_gap": metrics["train_gap"],
            "train_unfiltered_gap": metrics["train_unfiltered_gap"],
            "dropped_tokens": int((~torch.isfinite(want[mask])).sum()),
        }
        if place.returns_results:
            gaps[name]["old_gap"] = max_gap(old[mask], want[mask])
            gaps[name]["reference_gap"] = max_gap(ref[mask], want_unfiltered[mask])
    worker.close()
    return {"returns_results": place.returns_results, "gaps": gaps}
