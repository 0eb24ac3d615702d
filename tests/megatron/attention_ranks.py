"""Rank functions of the SDPA core-attention tests (spawned gloo ranks import them by this
stable module path). Each compares megatron-core's own ``DotProductAttention`` with
``hpcrl.core.backends.megatron.attention.SdpaCoreAttention`` on the same inputs/weights."""

from __future__ import annotations

import torch

VOCAB = 128
SEQ = 16


def _config(heads: int, groups: int, **extra):
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=heads,
        num_query_groups=groups,
        ffn_hidden_size=128,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        **{"attention_dropout": 0.0, **extra},
    )


def _init_parallel(tp: int) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(11)


def _gpt(config, spec):
    from megatron.core.models.gpt import GPTModel

    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
    )


def _logits_and_grads(model, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
    positions = torch.arange(SEQ).unsqueeze(0).expand_as(input_ids)
    logits = model(input_ids, positions, None)
    weights = torch.Generator().manual_seed(5)
    probe = torch.randn(logits.shape, generator=weights)
    (logits * probe).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logits.detach(), grads


def model_parity_run(rank: int, world_size: int, shapes: list[tuple[int, int]]) -> list[dict]:
    """For each (heads, query_groups): a GPTModel on the local spec and one on the SDPA spec
    with the same weights, at TP = world size; differences of logits and of all gradients."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from hpcrl.core.backends.megatron.attention import sdpa_layer_spec

    _init_parallel(world_size)
    input_ids = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(2))
    results = []
    for heads, groups in shapes:
        config = _config(heads, groups)
        base = _gpt(config, get_gpt_layer_local_spec())
        spec, replaced = sdpa_layer_spec(get_gpt_layer_local_spec())
        fused = _gpt(config, spec)
        fused.load_state_dict(base.state_dict(), strict=True)
        base_logits, base_grads = _logits_and_grads(base, input_ids)
        fused_logits, fused_grads = _logits_and_grads(fused, input_ids)
        results.append(
            {
                "replaced": replaced,
                "core_attention": sorted(
                    {
                        type(layer.self_attention.core_attention).__name__
                        for layer in fused.decoder.layers
                    }
                ),
                "logits_shape": tuple(fused_logits.shape),
                "logit_scale": float(base_logits.abs().max()),
                "logit_diff": float((fused_logits - base_logits).abs().max()),
                "grad_diff": max(
                    float((fused_grads[n] - base_grads[n]).abs().max()) for n in base_grads
                ),
                "grad_scale": max(float(g.abs().max()) for g in base_grads.values()),
            }
        )
    return results


def _pair(config, mask_type, layer_number: int = 1):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from hpcrl.core.backends.megatron.attention import SdpaCoreAttention

    kwargs = dict(
        config=config,
        layer_number=layer_number,
        attn_mask_type=mask_type,
        attention_type="self",
        cp_comm_type=None,
        softmax_scale=None,
        pg_collection=None,
    )
    return DotProductAttention(**kwargs).eval(), SdpaCoreAttention(**kwargs).eval()


def _qkv(heads: int, groups: int, seq_q: int, seq_k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    head_dim, batch = 16, 2
    query = torch.randn(seq_q, batch, heads, head_dim, generator=gen)
    key = torch.randn(seq_k, batch, groups, head_dim, generator=gen)
    value = torch.randn(seq_k, batch, groups, head_dim, generator=gen)
    return query, key, value


def module_cases_run(rank: int, world_size: int) -> dict:
    """Module-level differences (max abs) of SDPA vs DotProductAttention in cases the model
    test does not reach, plus the dropout statistics."""
    from megatron.core.transformer.enums import AttnMaskType

    _init_parallel(1)
    out: dict = {}
    heads, groups = 4, 2
    q, k, v = _qkv(heads, groups, SEQ, SEQ)
    causal_pair = _pair(_config(heads, groups), AttnMaskType.causal)
    pad_pair = _pair(_config(heads, groups), AttnMaskType.padding)
    # A padding-style mask (True = masked out): the last 5 keys of sample 1 hidden.
    mask = torch.zeros(2, 1, SEQ, SEQ, dtype=torch.bool)
    mask[1, :, :, -5:] = True
    for name, (ref, new), args in (
        ("causal_gqa", causal_pair, (q, k, v, None)),
        ("padding_mask", pad_pair, (q, k, v, mask)),
        ("causal_given_mask", causal_pair, (q, k, v, mask)),
        ("decode_one_query", causal_pair, (q[:1], k, v, None)),
        ("no_mask_padding_type", pad_pair, (q, k, v, None)),
    ):
        expected, got = ref(*args), new(*args)
        out[name] = (tuple(got.shape) == tuple(expected.shape), float((got - expected).abs().max()))
    scaled = _pair(_config(4, 4, apply_query_key_layer_scaling=True), AttnMaskType.causal, 3)
    q4, k4, v4 = _qkv(4, 4, SEQ, SEQ, seed=1)
    expected, got = scaled[0](q4, k4, v4, None), scaled[1](q4, k4, v4, None)
    out["query_key_layer_scaling"] = (True, float((got - expected).abs().max()))
    out["dropout"] = _dropout_stats(heads, groups)
    return out


def _dropout_stats(heads: int, groups: int, draws: int = 400) -> dict:
    """Attention dropout in training: outputs vary, their mean is the no-dropout output
    (inverted dropout), and eval mode is deterministic."""
    from megatron.core.transformer.enums import AttnMaskType

    ref, new = _pair(_config(heads, groups, attention_dropout=0.3), AttnMaskType.causal)
    q, k, v = _qkv(heads, groups, SEQ, SEQ, seed=3)
    clean = ref(q, k, v, None)
    new.train()
    samples = torch.stack([new(q, k, v, None) for _ in range(draws)])
    new.eval()
    return {
        "eval_diff": float((new(q, k, v, None) - clean).abs().max()),
        "train_spread": float(samples.std(dim=0).mean()),
        "mean_error": float((samples.mean(dim=0) - clean).abs().mean()),
        "clean_scale": float(clean.abs().mean()),
    }
