"""Decoders the Automodel backend shards with FSDP2 alone (``FSDP_ONLY_MODEL_TYPES`` in
hpcrl.config.architectures: no tensor-parallel plan, no expert parallelism) build and train
through the backend's own code: tiny random models of each type, built by transformers.

Each loads as the backend loads models (SDPA attention; gpt-oss's sinks: eager), has the decoder blocks FSDP shards,
and gives the backend's chunked log-probs equal to the model's own forward. A DeepSeek-V3
decoder (MLA attention, a dense first block, routed + shared experts: NeMo RL's Moonlight and
DeepSeek-V3 recipes) trained by FSDP over 2 Ray workers (gloo) matches one process: same
losses (falling on a repeated batch), same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hpcrl.config.architectures import FSDP_ONLY_MODEL_TYPES, TRANSFORMERS_5_MODEL_TYPES
from tests.core.parallel_harness import (
    full_weights,
    make_batch,
    masked_nll_loss,
    reference_logprobs,
    reference_training,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe, with_policy

COMMON = dict(
    vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=False, num_experts_per_tok=2,
)  # fmt: skip
#: per model type: its MoE shape (the first block dense where the architecture allows it)
SHAPES: dict[str, dict[str, Any]] = {
    "deepseek_v3": dict(
        n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
        n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4,
    ),
    "glm4_moe": dict(
        n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
        n_group=1, topk_group=1, head_dim=8,
    ),
    "qwen2_moe": dict(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=16),
    # Gemma 3's text decoder: four norms per block, scaled embeddings, local + global layers
    "gemma3_text": dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=4, sliding_window_pattern=2),
    # attention sinks, a sliding-window layer, biased experts (more: tests/core/test_gpt_oss.py)
    "gpt_oss": dict(
        num_local_experts=4, intermediate_size=16, head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    ),
}  # fmt: skip
#: transformers has no SDPA form of their attention: the backend loads them with eager
EAGER_ATTENTION = ("gpt_oss",)


def build_tiny(folder: Path, model_type: str) -> str:
    """A seeded random ``model_type`` decoder saved with hpcrl's character tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpcrl.core.models.tiny import build_char_tokenizer

    config = AutoConfig.for_model(model_type, **{**COMMON, **SHAPES[model_type]})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return str(folder)


def test_every_fsdp_only_type_has_a_tiny_model_here():
    # transformers 5's own (Nemotron-H): tests/transformers5, in the environment that has it
    only_5 = set(TRANSFORMERS_5_MODEL_TYPES) & set(FSDP_ONLY_MODEL_TYPES)
    assert set(SHAPES) | only_5 == set(FSDP_ONLY_MODEL_TYPES)


@pytest.mark.parametrize("model_type", list(SHAPES))
def test_it_loads_as_the_backend_loads_it_and_its_logprobs_match(tmp_path, model_type):
    from hpcrl.core.backends.automodel.model import TokenLogprobModel, load_hf_model
    from hpcrl.core.backends.automodel.parallelize import decoder_layers

    path = build_tiny(tmp_path / model_type, model_type)
    hf = load_hf_model(path, "cpu")
    assert hf.config.model_type == model_type
    want_attention = "eager" if model_type in EAGER_ATTENTION else "sdpa"
    assert hf.config._attn_implementation == want_attention
    assert len(decoder_layers(hf)) == 2
    batch = make_batch(seed=3, batch_size=4)
    with torch.no_grad():
        got, _ = TokenLogprobModel(hf, chunk_tokens=8)(batch["input_ids"], batch["attention_mask"])
        expected = reference_logprobs(hf, batch)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_fsdp_over_two_workers_trains_deepseek_v3_as_one_process(ray_cluster, tmp_path):
    path = build_tiny(tmp_path / "deepseek_v3", "deepseek_v3")
    recipe = with_policy(tiny_automodel_recipe(lr=1e-2), model_name=path)
    batches = [make_batch(seed=0)] * 4  # one batch again and again: its loss must fall
    policy = start_policy(recipe, path, world_size=2)
    try:
        losses = [policy.train(batch, masked_nll_loss)["loss"] for batch in batches]
        weights = policy.group.call_same("run", full_weights)[0]
    finally:
        policy.shutdown()
    ref_losses, ref_weights = reference_training(path, recipe, batches)
    assert losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-6)
    assert losses[-1] < losses[0]
    assert weights.keys() == ref_weights.keys()
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-4, rtol=0, msg=name)
