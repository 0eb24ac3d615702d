"""Fused core attention for megatron-core's local (no Transformer Engine) layer spec.

The local spec's ``DotProductAttention`` materialises the [b·heads, s, s] score matrix,
softmaxes it in a separate kernel and multiplies again: at sequence 2048 that is most of the
attention time and a large share of activation memory. ``SdpaCoreAttention`` is a drop-in
subclass that computes the same thing with ``torch.nn.functional.scaled_dot_product_attention``
(flash / memory-efficient kernels on CUDA, no S×S tensor kept for backward).

Being a subclass keeps megatron's constructor (both 0.16 and 0.19 call it with the same
keywords), its per-partition head counts, softmax scale and (empty) sharded state dict, so
checkpoints are unchanged. Cases SDPA does not express the same way (sliding-window layers,
softmax offsets, attention bias, causal masks with sq ≠ sk > 1) run the parent's forward
unchanged. Packed sequences (THD layout, ``PackedSeqParams``), which the parent refuses, run
as one SDPA call with a block-diagonal causal mask built from ``cu_seqlens``.

Context parallelism (CP > 1), which the parent refuses: each CP rank holds its load-balanced
chunks of every sequence (``context_parallel.py``). K and V are all-gathered over the CP group
(the backward sums their gradients back to the rank that owns them) and each local query
attends to the keys at or before its own global position, within its own packed sequence:
exact attention, on any backend torch.distributed has (gloo included). It is what runs where
Transformer Engine is absent; with TE, hpcrl builds TE's layer spec and megatron-core's own
CP attention runs instead.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SdpaCoreAttention(DotProductAttention):
    """``DotProductAttention`` with the score/softmax/context steps done by torch SDPA.

    Inputs as megatron passes them: query [sq, b, np, hn], key/value [sk, b, ng, hn] (heads of
    this TP rank; ng < np is grouped-query attention). Output [sq, b, np·hn], like the parent.
    """

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        # The parent asserts context_parallel_size == 1 (only TE's attention does CP); give it
        # a copy that says 1 and keep the real config (CP handled in _cp_forward).
        cp_size = int(getattr(config, "context_parallel_size", 1) or 1)
        parent_config = config
        if cp_size > 1:
            parent_config = copy.copy(config)
            parent_config.context_parallel_size = 1
        super().__init__(parent_config, *args, **kwargs)
        self.config = config
        self.cp_size = cp_size

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any | None = None,
    ) -> torch.Tensor:
        # attn_mask_type is ignored, as the parent does: the mask type is the constructor's.
        if self.cp_size > 1:
            return self._cp_forward(
                query, key, value, attention_mask, attention_bias, packed_seq_params
            )
        if packed_seq_params is not None and self._packs_supported(attention_bias):
            return self._packed_forward(query, key, value, packed_seq_params)
        mask_args = self._sdpa_mask(attention_mask, query.size(0), key.size(0))
        if mask_args is None or attention_bias is not None or packed_seq_params is not None:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        attn_mask, is_causal = mask_args
        seq_q, batch = query.size(0), query.size(1)
        # [s, b, heads, hn] -> [b, heads, s, hn]: strided views, last dim contiguous (SDPA ok).
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        context = self._sdpa(q, k, v, attn_mask, is_causal)
        # [b, np, sq, hn] -> [sq, b, np·hn]
        return context.permute(2, 0, 1, 3).reshape(seq_q, batch, self.hidden_size_per_partition)

    def _sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """SDPA over [b, heads, s, hn] views with this module's dropout, its RNG and scale
        (grouped-query attention when K/V have fewer heads)."""
        dropout_p = self.attention_dropout.p if self.training else 0.0
        kwargs = {"enable_gqa": True} if k.size(1) != q.size(1) else {}
        with self._dropout_rng(dropout_p):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                scale=self._effective_scale(), **kwargs,
            )  # fmt: skip

    def _packs_supported(self, attention_bias: torch.Tensor | None) -> bool:
        return (
            attention_bias is None
            and self.softmax_offset is None
            and self.scale_mask_softmax.window_size is None
            and self.attn_mask_type == AttnMaskType.causal
        )

    def _packed_forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed_seq_params: Any
    ) -> torch.Tensor:
        """THD layout (sequence packing): query [t, np, hn], key/value [t, ng, hn], sequences
        delimited by ``cu_seqlens``. One SDPA call over the pack with a block-diagonal causal
        mask: no token sees another sequence's. Output [t, np·hn]."""
        assert packed_seq_params.qkv_format == "thd", "only THD packs reach core attention"
        bounds = packed_seq_params.cu_seqlens_q_padded
        if bounds is None:
            bounds = packed_seq_params.cu_seqlens_q
        total = query.size(0)
        segment = torch.bucketize(
            torch.arange(total, device=query.device), bounds.to(query.device)[1:], right=True
        )
        same = segment[:, None] == segment[None, :]
        allowed = same & torch.ones_like(same).tril()
        q, k, v = (t.permute(1, 0, 2).unsqueeze(0) for t in (query, key, value))
        context = self._sdpa(q, k, v, allowed, is_causal=False)
        # [1, np, t, hn] -> [t, np·hn]
        return context[0].permute(1, 0, 2).reshape(total, self.hidden_size_per_partition)

    def _cp_forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attention_bias: torch.Tensor | None,
        packed_seq_params: Any | None,
    ) -> torch.Tensor:
        """This CP rank's queries against every rank's keys/values (module docstring).
        Unpacked: query [sq/CP, b, np, hn]; packed: [t/CP, np, hn] with global ``cu_seqlens``."""
        from hpcrl.core.backends.megatron.context_parallel import (
            all_rank_positions,
            chunk_positions,
            cp_group_and_size,
        )
        from hpcrl.core.cp_gather import gather_summed

        self._refuse_under_cp(attention_mask, attention_bias)
        packed = packed_seq_params is not None
        if packed_seq_params is not None:
            bounds_t = packed_seq_params.cu_seqlens_q_padded
            if bounds_t is None:
                bounds_t = packed_seq_params.cu_seqlens_q
            bounds = [int(b) for b in bounds_t.tolist()]
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
        else:
            bounds = [0, query.size(0) * self.cp_size]
        group, cp_rank, cp_size = cp_group_and_size()
        key, value = (gather_summed(t, 0, group) for t in (key, value))
        device = query.device
        q_pos = chunk_positions(bounds, cp_rank, cp_size, device)
        k_pos = all_rank_positions(bounds, cp_size, device)
        inner = torch.tensor(bounds[1:-1], dtype=torch.long, device=device)
        q_seg = torch.bucketize(q_pos, inner, right=True)
        k_seg = torch.bucketize(k_pos, inner, right=True)
        allowed = (q_seg[:, None] == k_seg[None, :]) & (k_pos[None, :] <= q_pos[:, None])
        seq_q, batch = query.size(0), query.size(1)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        context = self._sdpa(q, k, v, allowed, is_causal=False)
        out = context.permute(2, 0, 1, 3).reshape(seq_q, batch, self.hidden_size_per_partition)
        return out[:, 0] if packed else out

    def _refuse_under_cp(
        self, attention_mask: torch.Tensor | None, attention_bias: torch.Tensor | None
    ) -> None:
        unsupported = [
            name
            for name, present in (
                ("an explicit attention mask", attention_mask is not None),
                ("an attention bias", attention_bias is not None),
                ("softmax offsets", self.softmax_offset is not None),
                ("sliding-window attention", self.scale_mask_softmax.window_size is not None),
                ("a non-causal mask", self.attn_mask_type != AttnMaskType.causal),
            )
            if present
        ]
        if unsupported:
            raise NotImplementedError(
                "policy.megatron_cfg.context_parallel_size > 1 without Transformer Engine runs "
                f"hpcrl's CP attention, which does not support {', '.join(unsupported)}; set "
                "policy.megatron_cfg.context_parallel_size=1 or run where Transformer Engine "
                "is installed"
            )

    def _sdpa_mask(
        self, attention_mask: torch.Tensor | None, seq_q: int, seq_k: int
    ) -> tuple[torch.Tensor | None, bool] | None:
        """(attn_mask, is_causal) for SDPA with the parent's masking semantics, or None when
        this module should defer to the parent."""
        if self.softmax_offset is not None or self.scale_mask_softmax.window_size is not None:
            return None
        if attention_mask is not None:
            # The parent's unfused path uses a given mask as is (True = masked out), also for
            # the causal type; SDPA's boolean mask means "may attend".
            return ~attention_mask.bool(), False
        if self.attn_mask_type == AttnMaskType.causal and seq_q > 1:
            if seq_q != seq_k:  # the parent asserts here; let it
                return None
            return None, True
        return None, False

    def _effective_scale(self) -> float:
        # With apply_query_key_layer_scaling the parent divides the matmul scale by the layer
        # number and its softmax multiplies it back: the product is the real scale.
        coeff = self.scale_mask_softmax.scale
        return self.softmax_scale * (coeff if coeff is not None else 1.0)

    def _dropout_rng(self, dropout_p: float):
        # As the parent: attention dropout draws from the model-parallel RNG stream (each TP
        # rank holds different heads) unless sequence parallelism owns the RNG.
        if dropout_p > 0.0 and not self.config.sequence_parallel:
            return tensor_parallel.get_cuda_rng_tracker().fork()
        return contextlib.nullcontext()


def sdpa_layer_spec(spec: Any) -> tuple[Any, int]:
    """A copy of a layer or block spec with every ``core_attention=DotProductAttention``
    replaced by ``SdpaCoreAttention``, and the number replaced. Other specs (Transformer
    Engine's, MLA with its own attention) come back unchanged; the input is never mutated
    (megatron may share spec objects between layers)."""
    if isinstance(spec, list | tuple):
        items = [sdpa_layer_spec(item) for item in spec]
        count = sum(n for _, n in items)
        return (type(spec)(item for item, _ in items) if count else spec), count
    if not dataclasses.is_dataclass(spec) or isinstance(spec, type):
        return spec, 0
    changes, count = {}, 0
    for field in dataclasses.fields(spec):
        if not field.init:
            continue
        value = getattr(spec, field.name)
        if field.name == "core_attention" and value is DotProductAttention:
            changes[field.name], count = SdpaCoreAttention, count + 1
            continue
        new_value, replaced = sdpa_layer_spec(value)
        if replaced:
            changes[field.name], count = new_value, count + replaced
    return (dataclasses.replace(spec, **changes) if changes else spec), count


def apply_sdpa_core_attention(provider: Any) -> bool:
    """Swap the provider's local-spec core attention for ``SdpaCoreAttention``; True if any
    layer was swapped. A spec given as a function (built from the config later) is left as is."""
    spec, replaced = sdpa_layer_spec(provider.transformer_layer_spec)
    if replaced:
        provider.transformer_layer_spec = spec
    return replaced > 0
