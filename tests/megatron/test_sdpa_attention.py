"""The SDPA core attention (hpcrl/core/backends/megatron/attention.py) computes what
megatron-core's local-spec ``DotProductAttention`` computes: logits and gradients of a real
GPTModel at TP=1 and TP=2 (multi-head and grouped-query), masks, scaling and dropout at the
module level; and the provider path turns it on when Transformer Engine is absent."""

from __future__ import annotations

import pytest

from tests.megatron import attention_ranks, harness

SHAPES = [(4, 4), (4, 2)]  # (heads, query groups): multi-head, grouped-query


def _check_model_parity(results: list[dict], tp: int) -> None:
    for (heads, groups), result in zip(SHAPES, results, strict=True):
        label = f"tp={tp} heads={heads} groups={groups}"
        assert result["replaced"] == 1, label  # one layer spec, shared by both layers
        assert result["core_attention"] == ["SdpaCoreAttention"], label
        assert result["logits_shape"] == (3, attention_ranks.SEQ, attention_ranks.VOCAB // tp)
        assert result["logit_scale"] > 0.1, label  # not a degenerate all-zero model
        assert result["logit_diff"] < 1e-5, (label, result)
        assert result["grad_diff"] < 1e-5 * max(1.0, result["grad_scale"]), (label, result)


@pytest.mark.slow
def test_logits_and_grads_match_dot_product_attention_tp1():
    (results,) = harness.run_ranks(1, attention_ranks.model_parity_run, SHAPES)
    _check_model_parity(results, tp=1)


@pytest.mark.slow
def test_logits_and_grads_match_dot_product_attention_tp2():
    for results in harness.run_ranks(2, attention_ranks.model_parity_run, SHAPES):
        _check_model_parity(results, tp=2)


def test_module_cases_match_and_dropout_is_honoured():
    (out,) = harness.run_ranks(1, attention_ranks.module_cases_run)
    for name in (
        "causal_gqa",
        "padding_mask",
        "causal_given_mask",
        "decode_one_query",
        "no_mask_padding_type",
        "query_key_layer_scaling",
    ):
        same_shape, diff = out[name]
        assert same_shape and diff < 1e-5, (name, diff)
    dropout = out["dropout"]
    assert dropout["eval_diff"] < 1e-5, dropout
    assert dropout["train_spread"] > 0.05 * dropout["clean_scale"], dropout
    assert dropout["mean_error"] < 0.15 * dropout["train_spread"], dropout


def test_spec_swap_is_a_copy_and_leaves_other_specs_alone():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from hpcrl.core.backends.megatron.attention import SdpaCoreAttention, sdpa_layer_spec

    local = get_gpt_layer_local_spec()
    swapped, count = sdpa_layer_spec(local)
    assert count == 1
    assert swapped.submodules.self_attention.submodules.core_attention is SdpaCoreAttention
    assert local.submodules.self_attention.submodules.core_attention is DotProductAttention
    block, count = sdpa_layer_spec([local, local])
    assert count == 2 and all(
        s.submodules.self_attention.submodules.core_attention is SdpaCoreAttention for s in block
    )
    assert sdpa_layer_spec(swapped) == (swapped, 0)  # already swapped: nothing to do


def test_prepare_provider_uses_sdpa_without_transformer_engine(megatron_cpu, tmp_path):
    from megatron.bridge.models import GPTModelProvider

    from hpcrl.config.recipe import MegatronCfg
    from hpcrl.core.backends.megatron.attention import SdpaCoreAttention
    from hpcrl.core.backends.megatron.hf_import import read_run_config, save_run_config
    from hpcrl.core.backends.megatron.provider import (
        prepare_provider,
        transformer_engine_available,
    )

    assert not transformer_engine_available()
    provider = GPTModelProvider(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, vocab_size=128
    )
    prepare_provider(provider, MegatronCfg(enabled=True), "float32", 16)
    spec = provider.transformer_layer_spec
    assert spec.submodules.self_attention.submodules.core_attention is SdpaCoreAttention
    provider.finalize()
    save_run_config(provider, tmp_path / "run_config.yaml")  # the swapped spec still persists
    assert read_run_config(tmp_path)["num_layers"] == 2


def test_provider_takes_nemo_rl_recompute_and_moe_settings(megatron_cpu):
    """activation_checkpointing drives recompute (NeMo RL's full/uniform/1 defaults); MoE keys
    reach the provider under their own names; TE-only moe_permute_fusion is switched off."""
    from megatron.bridge.models import GPTModelProvider

    from hpcrl.config.recipe import MegatronCfg
    from hpcrl.core.backends.megatron.provider import prepare_provider

    def provider_for(**fields):
        provider = GPTModelProvider(
            num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, vocab_size=128
        )
        prepare_provider(provider, MegatronCfg(enabled=True, **fields), "float32", 16)
        return provider

    off = provider_for(recompute_granularity="full", recompute_method="block")
    assert off.recompute_granularity is None  # activation_checkpointing is false
    on = provider_for(activation_checkpointing=True)
    assert (on.recompute_granularity, on.recompute_method, on.recompute_num_layers) == (
        "full",
        "uniform",
        1,
    )
    moe = provider_for(
        moe_router_dtype="fp64",
        moe_router_load_balancing_type="none",
        moe_router_bias_update_rate=0.0,
        moe_permute_fusion=True,
    )
    assert (moe.moe_router_dtype, moe.moe_router_load_balancing_type) == ("fp64", "none")
    assert moe.moe_router_bias_update_rate == 0.0
    assert moe.moe_permute_fusion is False  # needs Transformer Engine, absent here


def test_recipe_fusions_are_switched_off_and_reported_without_transformer_engine(megatron_cpu):
    """recipes/base/megatron.yaml (like NeMo RL's configs) asks for apply_rope_fusion and
    bias_activation_fusion; without TE megatron-core's finalize() refuses the first, so the
    backend turns both off and says so (found on the H200 machine, which has no TE)."""
    from megatron.bridge.models import GPTModelProvider

    from hpcrl.config.recipe import MegatronCfg
    from hpcrl.core.backends.megatron.provider import prepare_provider

    provider = GPTModelProvider(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, vocab_size=128
    )
    cfg = MegatronCfg(enabled=True, apply_rope_fusion=True, bias_activation_fusion=True)
    turned_off = prepare_provider(provider, cfg, "float32", 16)
    assert {"apply_rope_fusion", "bias_activation_fusion"} <= set(turned_off)
    assert (provider.apply_rope_fusion, provider.bias_activation_fusion) == (False, False)
    provider.finalize()  # megatron-core accepts the provider
