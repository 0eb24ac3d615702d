"""The module the Automodel backend shards and trains: a HF causal LM plus token log-probs.

``TokenLogprobModel`` is the FSDP root. Its forward returns per-token log-probs computed in
sequence chunks (hidden states → lm_head → the model's own logit processing → temperature
and top-k/top-p of ``hpcrl.core.token_distribution`` → logsumexp → gather, each chunk
recomputed in backward), so the full-vocab fp32 logits of the batch never exist at once.
``mode="hf"`` runs the plain HF forward through the same root, which the sampler needs:
calling the inner HF module directly would skip FSDP's hooks that gather the root's
parameters.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpcrl.core.token_distribution import (
    LogitTransform,
    TokenDistribution,
    token_logprobs_from_logits,
)

# Sequence positions × batch rows per lm_head chunk; 4096 × 32k vocab × 4 B ≈ 0.5 GiB fp32.
DEFAULT_CHUNK_TOKENS = 4096


def _chunk_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    transform: LogitTransform,
    dist: TokenDistribution,
) -> torch.Tensor:
    """[..., 2]: processed and unfiltered log-probs of one chunk (one tensor: checkpointable)."""
    logits = transform.apply(F.linear(hidden, weight).float())
    processed, unfiltered = token_logprobs_from_logits(logits, targets, dist)
    return torch.stack([processed, unfiltered], dim=-1)


def token_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    input_ids: torch.Tensor,
    chunk_tokens: int,
    *,
    transform: LogitTransform | None = None,
    dist: TokenDistribution | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out[b, t] = log p(input_ids[b, t] | :t)`` from final hidden states; ``out[:, 0] = 0``.

    Returns (processed, unfiltered) as ``token_logprobs_from_logits`` defines them; no
    ``transform``/``dist``: the plain log-softmax of ``hidden @ lm_head_weight.T``.
    """
    transform = transform or LogitTransform()
    dist = dist or TokenDistribution()
    batch, seq = input_ids.shape
    shifted_hidden = hidden[:, :-1]
    targets = input_ids[:, 1:]
    step = max(1, chunk_tokens // max(batch, 1))
    recompute = torch.is_grad_enabled()
    pieces = [torch.zeros(batch, 1, 2, dtype=torch.float32, device=hidden.device)]
    for start in range(0, seq - 1, step):
        args = (
            shifted_hidden[:, start : start + step],
            lm_head_weight,
            targets[:, start : start + step],
            transform,
            dist,
        )
        if recompute:
            pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(*args))
    both = torch.cat(pieces, dim=1)
    return both[..., 0], both[..., 1]


class TokenLogprobModel(nn.Module):
    """Root module: ``hf`` is the wrapped ``AutoModelForCausalLM``."""

    def __init__(self, hf_model: nn.Module, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> None:
        super().__init__()
        self.hf = hf_model
        self.chunk_tokens = chunk_tokens
        self.logit_transform = LogitTransform.of_config(hf_model.config)
        # Set by ``apply_autocast`` when FSDP's mixed precision is not in use.
        self.autocast_dtype: torch.dtype | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        mode: str = "logprobs",
        **kwargs: Any,
    ) -> Any:
        """mode "logprobs": (processed, unfiltered) log-probs under ``distribution=`` (a
        ``TokenDistribution``, default the model's own); with ``position_ids=`` restarting at
        0 per sequence and no attention mask, a packed row whose attention stops at each
        sequence's start (transformers builds that mask from the positions). mode "hf": the
        HF forward."""
        if self.autocast_dtype is None:
            return self._forward(input_ids, attention_mask, mode, **kwargs)
        device_type = input_ids.device.type
        with torch.autocast(device_type, dtype=self.autocast_dtype):
            return self._forward(input_ids, attention_mask, mode, **kwargs)

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        mode: str,
        distribution: TokenDistribution | None = None,
        **hf_kwargs: Any,
    ) -> Any:
        if mode == "hf":
            return self.hf(input_ids=input_ids, attention_mask=attention_mask, **hf_kwargs)
        assert mode == "logprobs", f"unknown mode {mode!r}"
        decoder_out = self.hf.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=hf_kwargs.get("position_ids"),
            use_cache=False,
        )
        weight = self.hf.get_output_embeddings().weight
        return token_logprobs(
            decoder_out.last_hidden_state,
            weight,
            input_ids,
            self.chunk_tokens,
            transform=self.logit_transform,
            dist=distribution,
        )


class HfCallable:
    """What the sampler calls: looks like the HF model, runs through the FSDP root."""

    def __init__(self, root: TokenLogprobModel) -> None:
        self._root = root
        self.config = root.hf.config

    def parameters(self) -> Any:
        return self._root.parameters()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._root(*args, mode="hf", **kwargs)


def load_hf_model(model_path: str, device: str) -> nn.Module:
    """fp32 weights from a local HF folder (GPU runs compute in bf16 through FSDP's policy)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.config.use_cache = False
    if device == "cuda":
        model = model.to("cuda")
    return model
