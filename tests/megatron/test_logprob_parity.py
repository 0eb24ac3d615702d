"""The Megatron backend's log-probs equal the HF forward's under the sampling distribution
(temperature, top-k/top-p; issue 15's contract) at TP=1 and TP=2 (TP-sharded vocabulary),
in its log-prob, reference and training passes; and models whose HF forward post-processes
logits are refused with the reason. Tolerance 1e-4 nats (float32 on CPU)."""

from __future__ import annotations

import json
import math

import pytest

from tests.megatron import harness, logprob_parity
from tests.megatron.tiny_hf import build_tiny_hf_model

TOLERANCE = 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_logprobs_equal_the_hf_forward_under_the_sampling_distribution(converted, tp):
    hf_path, root = converted
    results = harness.run_ranks(tp, logprob_parity.parity_run, hf_path, root, tp)
    reporting = [r for r in results if r["returns_results"]]
    assert len(reporting) == 1
    print(f"TP={tp} gaps:", reporting[0]["gaps"])  # shown with -s; the report quotes them
    for name, gaps in reporting[0]["gaps"].items():
        for key in ("old_gap", "reference_gap"):
            assert gaps[key] < TOLERANCE, (name, key, gaps)
    for result in results:
        for name, gaps in result["gaps"].items():
            # summed over the 4 micro-batches by the backend: a bound on each
            assert gaps["train_gap"] < TOLERANCE * 4, (name, gaps)
            assert gaps["train_unfiltered_gap"] < TOLERANCE * 4, (name, gaps)
    # top-k/top-p did drop some of the (random) target tokens: the -inf path was exercised
    assert reporting[0]["gaps"]["t0.6_topk8_topp0.7"]["dropped_tokens"] > 0
    assert reporting[0]["gaps"]["t0.7"]["dropped_tokens"] == 0
    assert not any(math.isinf(g["train_gap"]) for g in reporting[0]["gaps"].values())


def test_models_that_process_their_logits_are_refused(tmp_path):
    """The job's check before any worker (``hpcrl.core.models.buildable``), on the
    config.json transformers itself writes for a soft-capped Gemma 2."""
    import torch
    import transformers

    from hpcrl.config.recipe import GenerationCfg
    from hpcrl.core.models.buildable import unbuildable_model
    from tests.recipe_builder import megatron_recipe, with_policy

    def recipe_for(path):
        vllm = GenerationCfg(backend="vllm")  # the sampler's own refusal stays out of it
        return with_policy(megatron_recipe(), model_name=str(path), generation=vllm)

    plain = build_tiny_hf_model(tmp_path / "llama", "llama")
    assert unbuildable_model(recipe_for(plain), str(plain)) is None
    config = transformers.Gemma2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    torch.manual_seed(0)
    gemma2 = tmp_path / "gemma2"
    transformers.Gemma2ForCausalLM(config).save_pretrained(gemma2)
    problem = unbuildable_model(recipe_for(gemma2), str(gemma2))
    assert problem is not None and problem.path == "policy.model_name"
    assert "(final_logit_softcapping 30)" in problem.message
    # a config.json that leaves the soft-cap to transformers' default (30) is refused too
    saved = json.loads((gemma2 / "config.json").read_text())
    del saved["final_logit_softcapping"]
    (gemma2 / "config.json").write_text(json.dumps(saved))
    assert unbuildable_model(recipe_for(gemma2), str(gemma2)) == problem
