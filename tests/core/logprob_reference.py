"""Reference log-probs written from the contract's formula, independent of hpcrl's code:
``log_softmax(filter(logits / T))`` with vLLM's filter order (top-k, then top-p on what is
left; a token stays when the tokens less likely than it hold more than 1 − top_p of the
mass). Used by tests/core/test_logprob_contract.py and the Megatron parity ranks."""

from __future__ import annotations

import torch

from hpcrl.config.recipe import GenerationCfg


def reference_filter(scaled: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Written from the formula, ascending sort as vLLM does it (independent of hpcrl's)."""
    out = scaled.clone()
    if top_k is not None:
        kth = scaled.sort(dim=-1, descending=True).values[..., top_k - 1 : top_k]
        out = out.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        values, order = out.sort(dim=-1)  # ascending
        mass_up_to = values.softmax(dim=-1).cumsum(dim=-1)
        drop = mass_up_to <= 1 - top_p
        drop[..., -1] = False
        out = out.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return out


def reference_logprobs(logits: torch.Tensor, ids: torch.Tensor, cfg: GenerationCfg, filtered=True):
    """[B, T] log-probs of ids[:, 1:] (column 0 = 0) under cfg's distribution."""
    scaled = logits[:, :-1].double() / cfg.temperature
    if filtered:
        scaled = reference_filter(scaled, cfg.top_k, cfg.top_p)
    taken = scaled.log_softmax(dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(ids.shape[0], 1, dtype=taken.dtype), taken], dim=1).float()
