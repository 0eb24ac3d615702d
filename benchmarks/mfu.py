"""Model FLOPs per token and MFU under the two attention conventions, each labelled.

Per token of a decoder-only transformer, training (forward + backward = 3 × forward):
- ``6·N``: the matmuls of the non-embedding parameters N.
- attention scores and values: ``12·L·H·S`` when every query attends to all S keys (PaLM's
  formula, the one most papers print), ``6·L·H·S`` when the causal mask is counted (each query
  attends on average to S/2 keys, what a causal flash kernel computes).
- the lm_head, ``6·V·H``, which some count and some do not.

Every figure a benchmark prints names its convention: ``MFU`` (full attention, no lm_head),
``MFU causal`` (causal attention, no lm_head), and both with ``+lm``.
"""

from __future__ import annotations

from typing import Any

PEAK_TFLOPS_H200_BF16 = 989.0  # dense bf16, the H200's data sheet
CONVENTIONS = ("MFU", "MFU causal", "MFU+lm", "MFU causal+lm")
LEGEND = (
    "MFU: 6·N(non-embedding) + 12·L·H·S FLOPs per token (attention over the full S×S scores); "
    "MFU causal: 6·N + 6·L·H·S (causal mask: half the attention FLOPs); "
    "+lm: plus the lm_head's 6·V·H. Peak: {peak:.0f} TFLOP/s dense bf16."
)


def flops_per_token(spec: Any, seq_len: int) -> dict[str, float]:
    """Training FLOPs per token under each of ``CONVENTIONS``, for a Llama-shaped ``spec``
    (hidden_size, num_hidden_layers, intermediate_size, num_attention_heads,
    num_key_value_heads, vocab_size)."""
    hidden, layers, ffn = spec.hidden_size, spec.num_hidden_layers, spec.intermediate_size
    head_dim = hidden // spec.num_attention_heads
    kv = spec.num_key_value_heads * head_dim
    per_layer = hidden * hidden * 2 + hidden * kv * 2 + 3 * hidden * ffn + 2 * hidden
    non_embedding = layers * per_layer + hidden
    full_attention = 12 * layers * hidden * seq_len
    lm_head = 6 * (spec.vocab_size or 256) * hidden
    full = 6 * non_embedding + full_attention
    causal = 6 * non_embedding + full_attention / 2
    return {
        "MFU": float(full),
        "MFU causal": float(causal),
        "MFU+lm": float(full + lm_head),
        "MFU causal+lm": float(causal + lm_head),
    }


def mfu(tokens_per_s: float, flops: dict[str, float], peak_tflops: float) -> dict[str, float]:
    return {name: tokens_per_s * value / (peak_tflops * 1e12) for name, value in flops.items()}


def mfu_header() -> str:
    return " ".join(f"{name:>13}" for name in CONVENTIONS)


def mfu_cells(tokens_per_s: float, flops: dict[str, float], device: str, peak_tflops: float) -> str:
    """The four MFU columns (``n/a`` off the GPU: CPU FLOPs have no meaningful peak here)."""
    if device != "cuda":
        return " ".join(f"{'n/a':>13}" for _ in CONVENTIONS)
    values = mfu(tokens_per_s, flops, peak_tflops)
    return " ".join(f"{values[name]:>13.1%}" for name in CONVENTIONS)
