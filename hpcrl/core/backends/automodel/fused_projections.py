"""One matmul for a decoder block's Q/K/V projections and one for its MLP's gate/up, where
their weights compute through compute copies (``master_weights``).

Why: at the 1.1B's train shape (4 x 2048 tokens, hidden 2048) the three Q/K/V matmuls of a
block take 0.945 ms forward and backward, one matmul of the stacked weight 0.820 ms; gate/up
1.747 against 1.633 ms (one H100, ``benchmarks/fused_projections.py``): ~3.8 ms of a ~102 ms
train step (docs/performance.md, issue 25 item 1). The copies make the fusion free of any
copy per step: the projections' bf16 copies become rows of one leaf tensor
(``ComputeCopies.fuse``), the optimizer still steps each fp32 weight with its rows (same state,
same checkpoints, same state dict: the module tree and its parameters do not change).

Only blocks whose forward is known are fused, by their class name (a module's own forward is
replaced by the same computation with the fused matmul): the gate/up MLPs of Llama, Mistral,
Qwen2 and Qwen3 (``down(act(gate(x)) * up(x))``), and Llama's attention, without biases. Any
other block keeps its separate matmuls.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpcrl.core.backends.automodel.master_weights import ComputeCopies, ComputeCopyLinear

#: MLP classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``.
GATE_UP_MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
#: Attention classes whose forward ``FusedQKVAttention.forward`` computes.
QKV_ATTENTIONS = frozenset({"LlamaAttention"})


class FusedRowsLinear(ComputeCopyLinear):
    """A projection whose copy is rows of its block's fused copy (the block multiplies by
    all of them at once; called alone it multiplies by its own rows)."""


class GateUpMLP(nn.Module):
    """``down_proj(act_fn(gate) * up)``, gate and up from one matmul by ``gate_up_weight``."""

    gate_up_weight: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_weight).split(self.fused_rows, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class FusedQKVAttention(nn.Module):
    """Llama's attention (transformers 4.57 and 5.x compute the same), Q, K and V from one
    matmul by ``qkv_weight``. A call with a KV cache goes to the unfused forward."""

    qkv_weight: torch.Tensor

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        if past_key_values is not None or position_embeddings is None:
            return self.unfused_class.forward(
                self, hidden_states, position_embeddings, attention_mask,
                past_key_values=past_key_values, **kwargs,
            )  # fmt: skip
        kwargs.pop("cache_position", None)  # a named argument of the unfused forward
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query, key, value = (
            part.view(hidden_shape).transpose(1, 2)
            for part in F.linear(hidden_states, self.qkv_weight).split(self.fused_rows, dim=-1)
        )
        rotary, eager, functions = self.hf_functions
        cos, sin = position_embeddings
        query, key = rotary(query, key, cos, sin)
        name = self.config._attn_implementation
        attention = eager if name == "eager" else functions[name]
        output, weights = attention(
            self, query, key, value, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, **kwargs,
        )  # fmt: skip
        output = output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(output), weights


def apply_fused_projections(hf_model: nn.Module, copies: ComputeCopies) -> int:
    """Fuse every known block's projections (module docstring); returns how many groups."""
    fused = 0
    for module in list(hf_model.modules()):
        name = type(module).__name__
        if name in GATE_UP_MLPS and _fuse(
            module, ("gate_proj", "up_proj"), "gate_up_weight", copies
        ):
            module.__class__ = GateUpMLP
            fused += 1
        elif name in QKV_ATTENTIONS and _fuse(
            module, ("q_proj", "k_proj", "v_proj"), "qkv_weight", copies
        ):
            hf_module = sys.modules[type(module).__module__]
            module.unfused_class = type(module)
            module.hf_functions = (
                hf_module.apply_rotary_pos_emb,
                hf_module.eager_attention_forward,
                hf_module.ALL_ATTENTION_FUNCTIONS,
            )
            module.__class__ = FusedQKVAttention
            fused += 1
    return fused


def _fuse(module: nn.Module, names: tuple[str, ...], leaf_name: str, copies: ComputeCopies) -> bool:
    """``names``' copies as rows of one leaf, registered as ``leaf_name``; False (nothing
    changed) unless each is a bias-free ``ComputeCopyLinear`` of the same input size."""
    projections = [getattr(module, name, None) for name in names]
    if not all(type(p) is ComputeCopyLinear and p.bias is None for p in projections):
        return False
    if len({p.in_features for p in projections}) != 1:
        return False
    leaf = copies.fuse([p.weight for p in projections])
    for projection in projections:
        projection.__class__ = FusedRowsLinear
        projection.compute_weight = copies.copy_of[id(projection.weight)]
    module.register_buffer(leaf_name, leaf, persistent=False)
    module.fused_rows = [p.out_features for p in projections]
    return True
