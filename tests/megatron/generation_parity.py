"""Rank function of the Megatron-generation parity test (spawned children import it by path).

``policy.generation.backend: megatron`` as a GRPO training rank runs it: the MegatronWorker
trains a step (its weights leave the checkpoint's), the engine ``engine_spec`` builds for the
recipe is refitted from the worker's ``export_hf_weights`` and samples under the recipe's
temperature/top-k/top-p; the worker's own log-prob pass then scores those samples under the
same sampling distribution. The two must agree token by token, and both differ from the
checkpoint's log-probs (the samples come from the policy's current weights).
"""

from __future__ import annotations

from typing import Any

import attrs

from tests.megatron import harness
from tests.megatron.logprob_parity import max_gap
from tests.recipe_builder import tiny_megatron_recipe

SAMPLING = {"temperature": 0.7, "top_k": 8, "top_p": 0.9, "max_new_tokens": 8}


def megatron_generation_recipe(hf_path: str) -> Any:
    from hpcrl.config.recipe import GenerationCfg, GrpoCfg

    recipe = tiny_megatron_recipe(hf_path, lr=3e-2)
    generation = GenerationCfg(backend="megatron", **SAMPLING)
    policy = attrs.evolve(recipe.policy, generation=generation)
    return attrs.evolve(recipe, policy=policy, sft=None, grpo=GrpoCfg(num_prompts_per_step=2))


def generation_parity_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, prompts: list
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from hpcrl.core.generation.engine import engine_spec
    from hpcrl.core.token_distribution import TokenDistribution
    from tests.core.logprob_reference import reference_logprobs

    recipe = megatron_generation_recipe(hf_path)
    worker, place = harness.setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    batch = harness.fixed_batch()
    worker.train_step(
        harness.micro_batches(harness.shard(batch, place), 2),
        harness.masked_nll,
        float(batch["token_mask"].sum()),
    )
    spec = engine_spec(recipe, hf_path, "cpu")
    engine = spec.build()
    engine.update_weights(worker.export_hf_weights())
    cfg = recipe.policy.generation
    out = engine.generate(prompts, cfg, seed=5)
    worker.distribution = TokenDistribution.of_generation(cfg)
    scored = worker.logprobs(
        {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}
    )
    hf = AutoModelForCausalLM.from_pretrained(hf_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits
    at_checkpoint = reference_logprobs(logits, out["input_ids"], cfg)
    mask = out["response_mask"].bool()
    worker.close()
    sampled = out["generation_logprobs"][mask]
    return {
        "engine_backend": spec.backend,
        "tokens": int(mask.sum()),
        "gap": max_gap(scored[mask], sampled),
        "checkpoint_gap": float((at_checkpoint[mask] - sampled).abs().max()),
    }
