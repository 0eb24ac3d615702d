"""Generation from the Megatron worker's weights: the torch engine refitted from
``export_hf_weights`` (TP shards gathered by megatron-bridge) samples exactly what the
sampler samples from the HF checkpoint, and a training step changes what is sampled."""

from __future__ import annotations

import pytest
import torch

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.padding import pad_prompts
from hpcrl.core.generation.torch_sampler import generate
from tests.megatron import harness

# Spawns gloo ranks that build real megatron-core models: minutes on the 2-core machine.
pytestmark = pytest.mark.slow

PROMPTS = [[5, 9, 14, 20], [33, 7], [50, 51, 52, 53, 54, 55], [4]]


def test_tp2_greedy_generation_equals_hf(converted):
    from transformers import AutoModelForCausalLM

    hf_path, root = converted
    results = harness.run_ranks(2, harness.generate_run, hf_path, root, 2, PROMPTS)
    model = AutoModelForCausalLM.from_pretrained(hf_path, torch_dtype=torch.float32).eval()
    input_ids, attention_mask = pad_prompts(PROMPTS, 0)
    expected = generate(
        model,
        input_ids,
        attention_mask,
        GenerationCfg(max_new_tokens=8, temperature=0.0),
        seed=3,
        eos_token_id=2,
        pad_token_id=0,
    )
    for result in results:  # TP peers sample the same tokens
        assert torch.equal(result["before"]["input_ids"], expected["input_ids"])
        assert torch.allclose(
            result["before"]["generation_logprobs"], expected["generation_logprobs"], atol=1e-5
        )
        assert not torch.equal(
            result["after"]["generation_logprobs"], result["before"]["generation_logprobs"]
        )


def test_megatron_generation_samples_follow_the_policy_distribution(converted):
    """policy.generation.backend megatron: the in-process engine, refitted from the trained
    Megatron worker, samples tokens whose log-probs equal the worker's own log-prob pass under
    the sampling distribution (temperature 0.7, top-k 8, top-p 0.9) to 1e-4 nats, and not the
    checkpoint's (the training step moved them)."""
    from tests.megatron import generation_parity

    hf_path, root = converted
    (result,) = harness.run_ranks(
        1, generation_parity.generation_parity_run, hf_path, root, PROMPTS
    )
    assert result["engine_backend"] == "torch"  # hpcrl's sampler, fed by the Megatron refit
    assert result["tokens"] >= 16, result
    assert result["gap"] < 1e-4, result
    assert result["checkpoint_gap"] > 1e-2, result
