"""The Megatron model's weights with Hugging Face names, straight from the live parameters,
when one rank holds the whole model (TP = PP = CP = EP = 1, no virtual pipeline).

The refit of a colocated generation engine then needs no gather and no host round trip:
megatron-bridge's export (``generation.export_hf_weights``) moves every tensor to host memory
and the engine copies it back, which took most of a GRPO step (docs/performance.md, "Figures behind the code"). Here
most tensors are the parameters themselves (views, on the device); only the fused q/k/v
projection is split into Hugging Face's three matrices, and the fused gate/up projection is
cut into its two halves (views).

Layouts (megatron-core's GPT model, local and Transformer Engine specs):
- ``linear_qkv`` holds, per query group, that group's query heads, then its key head, then
  its value head: ``[groups × (heads_per_group + 2) × head_dim, hidden]``;
- ``linear_fc1`` of a gated MLP is ``[gate; up]``;
- the TE spec fuses the block's norms into the next linear (``layer_norm_weight``).

``direct_hf_weights`` returns None for anything it does not map (an unknown parameter name,
a parallel layout, a non-gated MLP): the caller then uses the bridge.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# Megatron name inside a block -> Hugging Face name inside ``model.layers.N.``; q/k/v and
# fc1 are split by ``_split``.
_BLOCK_NAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def applies() -> bool:
    """One rank holds every weight (the parallel state is initialised)."""
    from megatron.core import parallel_state as ps

    sizes = (
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_context_parallel_world_size(),
        ps.get_expert_model_parallel_world_size(),
    )
    return all(
        size == 1 for size in sizes
    ) and ps.get_virtual_pipeline_model_parallel_world_size() in (None, 1)


def live_parameters(model_chunks: list) -> Iterator[tuple[str, torch.Tensor]]:
    """(name inside the GPT model, parameter) of every chunk, wrapper prefixes removed."""
    for chunk in model_chunks:
        for name, param in chunk.named_parameters():
            while name.startswith("module."):
                name = name.removeprefix("module.")
            yield name, param


def direct_hf_weights(model_chunks: list, config: Any) -> list[tuple[str, torch.Tensor]] | None:
    """HF-named tensors (views of the live parameters where the layouts agree), or None when
    some parameter has no mapping here. ``config``: megatron's ``TransformerConfig``."""
    if not getattr(config, "gated_linear_unit", False):
        return None
    out: list[tuple[str, torch.Tensor]] = []
    with torch.no_grad():
        for name, param in live_parameters(model_chunks):
            mapped = _map(name, param.detach(), config)
            if mapped is None:
                return None
            out.extend(mapped)
    return out


def _map(name: str, tensor: torch.Tensor, config: Any) -> list[tuple[str, torch.Tensor]] | None:
    if name in _TOP_NAMES:
        return [(_TOP_NAMES[name], tensor)]
    match = _LAYER.match(name)
    if match is None:
        return None
    prefix, inner = f"model.layers.{match.group(1)}.", match.group(2)
    if inner in _BLOCK_NAMES:
        return [(prefix + _BLOCK_NAMES[inner], tensor)]
    if inner in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = inner.rsplit(".", 1)[1]
        q, k, v = split_qkv(tensor, config)
        attn = prefix + "self_attn."
        return [
            (f"{attn}q_proj.{kind}", q),
            (f"{attn}k_proj.{kind}", k),
            (f"{attn}v_proj.{kind}", v),
        ]
    if inner == "mlp.linear_fc1.weight":
        gate, up = tensor.chunk(2, dim=0)
        return [(prefix + "mlp.gate_proj.weight", gate), (prefix + "mlp.up_proj.weight", up)]
    return None


def split_qkv(fused: torch.Tensor, config: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hugging Face's q, k, v from megatron's per-group layout (weight [rows, hidden] or bias
    [rows]); q is a copy (its groups are not contiguous), k and v are copies too (strided)."""
    heads = config.num_attention_heads
    groups = config.num_query_groups or heads
    head_dim = config.kv_channels or config.hidden_size // heads
    per_group = heads // groups
    rest = fused.shape[1:]
    grouped = fused.view(groups, per_group + 2, head_dim, *rest)
    q = grouped[:, :per_group].reshape(heads * head_dim, *rest)
    k = grouped[:, per_group].reshape(groups * head_dim, *rest)
    v = grouped[:, per_group + 1].reshape(groups * head_dim, *rest)
    return q, k, v
