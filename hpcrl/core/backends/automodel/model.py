"""The module the Automodel backend shards and trains: a HF causal LM plus token log-probs.

``TokenLogprobModel`` is the FSDP root. Its forward returns per-token log-probs computed in
sequence chunks (hidden states → lm_head → the model's own logit processing → temperature
and top-k/top-p of ``hpcrl.core.token_distribution`` → logsumexp → gather, each chunk
recomputed in backward), so the full-vocab fp32 logits of the batch never exist at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

from hpcrl.core.backends.automodel.causal_attention import explicit_mask, uses_causal_attention
from hpcrl.core.backends.automodel.expert_layout import unfuse_experts
from hpcrl.core.backends.automodel.lora import LoraLinear
from hpcrl.core.backends.automodel.master_weights import ComputeCopies, head_weight
from hpcrl.core.token_distribution import (
    LogitTransform,
    TokenDistribution,
    token_logprobs_from_logits,
)

# Sequence positions × batch rows per lm_head chunk; 4096 × 32k vocab × 4 B ≈ 0.5 GiB fp32.
DEFAULT_CHUNK_TOKENS = 4096
# A train micro-batch's chunks keep what their backward reads (the fp32 log-softmax; with the
# fused head of ``target_logprob`` the bf16 logits, half of it) while that, counted at 4 bytes
# a logit, takes at most this; above it each chunk recomputes its logits in backward. The
# recompute (a second lm_head GEMM, softmax and casts) was ~3% of a 1.1B train step of
# 4 x 2048 tokens on an H100 (docs/performance.md, issue 25 item 1); 4 x 2048 tokens of a
# 32k vocabulary keep 0.98 GiB.
HEAD_KEEP_BYTES = 1 << 30


def _chunk_logprobs(
    hidden: torch.Tensor,
    head: torch.Tensor | nn.Module,
    targets: torch.Tensor,
    transform: LogitTransform,
    dist: TokenDistribution,
    fused: bool = True,
) -> torch.Tensor:
    """[..., 2]: processed and unfiltered log-probs of one chunk (one tensor: checkpointable).
    ``head``: the lm_head weight, or the lm_head module when it carries a LoRA adapter.
    ``fused``: score through ``target_logprob`` where ``fused_head_applies``."""
    projected = F.linear(hidden, head) if isinstance(head, torch.Tensor) else head(hidden)
    # a plain tensor only: Triton reads its storage (a DTensor's is one shard of it)
    plain = type(projected) is torch.Tensor
    if (
        fused
        and plain
        and fused_head_applies(projected.device.type, projected.dtype, transform, dist)
    ):
        from hpcrl.core.backends.automodel.target_logprob import target_logprobs

        both = target_logprobs(projected, targets, dist.temperature)
        return torch.stack([both, both], dim=-1)
    logits = transform.apply(projected.float())
    processed, unfiltered = token_logprobs_from_logits(logits, targets, dist)
    return torch.stack([processed, unfiltered], dim=-1)


def fused_head_applies(
    device_type: str, logits_dtype: torch.dtype, transform: LogitTransform, dist: TokenDistribution
) -> bool:
    """Whether ``target_logprob`` scores a chunk straight from its logits: bf16 logits on a
    GPU (Triton), no logit processing, no top-k/top-p (processed = unfiltered)."""
    return (
        device_type == "cuda"
        and logits_dtype == torch.bfloat16
        and transform.is_identity
        and not dist.filters
    )


def token_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor | nn.Module,
    input_ids: torch.Tensor,
    chunk_tokens: int,
    *,
    transform: LogitTransform | None = None,
    dist: TokenDistribution | None = None,
    targets: torch.Tensor | None = None,
    keep_bytes: int = HEAD_KEEP_BYTES,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out[b, t] = log p(input_ids[b, t] | :t)`` from final hidden states; ``out[:, 0] = 0``.
    With ``targets``: ``out[b, t] = log p(targets[b, t] | hidden[b, t])``, no shift (context
    parallelism: a rank's positions are not contiguous, it names each one's next token).

    Returns (processed, unfiltered) as ``token_logprobs_from_logits`` defines them; no
    ``transform``/``dist``: the plain log-softmax of ``hidden @ lm_head_weight.T``. With
    gradients, chunks recompute their logits in backward when keeping every chunk's fp32
    log-softmax would take more than ``keep_bytes``. ``fused``: chunks whose bf16 logits
    ``fused_head_applies`` to are scored by ``target_logprob`` (one Triton pass each way).
    """
    transform = transform or LogitTransform()
    dist = dist or TokenDistribution()
    batch = input_ids.shape[0]
    if targets is None:
        shifted_hidden = hidden[:, :-1]
        targets = input_ids[:, 1:]
        pieces = [torch.zeros(batch, 1, 2, dtype=torch.float32, device=hidden.device)]
    else:
        shifted_hidden = hidden
        pieces = []
    step = max(1, chunk_tokens // max(batch, 1))
    head = lm_head_weight if isinstance(lm_head_weight, torch.Tensor) else lm_head_weight.weight
    recompute = torch.is_grad_enabled() and targets.numel() * head.shape[0] * 4 > keep_bytes
    for start in range(0, targets.shape[1], step):
        args = (
            shifted_hidden[:, start : start + step],
            lm_head_weight,
            targets[:, start : start + step],
            transform,
            dist,
            fused,
        )
        if recompute:
            pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(*args))
    both = torch.cat(pieces, dim=1)
    return both[..., 0], both[..., 1]


class TokenLogprobModel(nn.Module):
    """Root module: ``hf`` is the wrapped ``AutoModelForCausalLM``."""

    def __init__(
        self,
        hf_model: nn.Module,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        compute_copies: ComputeCopies | None = None,
    ) -> None:
        super().__init__()
        self.hf = hf_model
        self.chunk_tokens = chunk_tokens
        # bf16 copies of the linear weights the forwards compute with (``master_weights``)
        self.compute_copies = compute_copies
        self.head_keep_bytes = HEAD_KEEP_BYTES  # ``token_logprobs``' keep_bytes
        self.fused_head = True  # ``token_logprobs``' fused (off: a benchmark's baseline)
        self.logit_transform = LogitTransform.of_config(hf_model.config)
        # Set by ``apply_autocast`` when FSDP's mixed precision is not in use, with the
        # handle of its hook that casts the embedding's output.
        self.autocast_dtype: torch.dtype | None = None
        self.residual_cast: RemovableHandle | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        distribution: TokenDistribution | None = None,
        position_ids: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        context_parallel: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(processed, unfiltered) log-probs under ``distribution`` (a ``TokenDistribution``,
        default the model's own), as ``token_logprobs`` defines them. With ``position_ids``
        restarting at 0 per sequence and no attention mask: a packed row whose attention
        stops at each sequence's start (transformers builds that mask from the positions).
        ``targets`` and ``context_parallel``: one CP rank's share
        (``hpcrl.core.backends.automodel.context_parallel.context_parallel_logprobs``)."""
        args = (input_ids, attention_mask, distribution, position_ids, targets, context_parallel)
        if self.compute_copies is not None:
            self.compute_copies.refresh()  # weights written since (a checkpoint load)
        if self.autocast_dtype is None:
            return self._forward(*args)
        with torch.autocast(input_ids.device.type, dtype=self.autocast_dtype):
            return self._forward(*args)

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        distribution: TokenDistribution | None,
        position_ids: torch.Tensor | None,
        targets: torch.Tensor | None,
        context_parallel: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Passed on only when set: transformers hands extra keywords to the attention function.
        extra = {} if context_parallel is None else {"context_parallel": context_parallel}
        needs_mask = attention_mask is not None or position_ids is not None
        if needs_mask and uses_causal_attention(self.hf):
            attention_mask = explicit_mask(input_ids, attention_mask, position_ids)
        decoder_out = self.hf.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **extra,
        )
        head = self.hf.get_output_embeddings()
        return token_logprobs(
            decoder_out.last_hidden_state,
            head if isinstance(head, LoraLinear) else head_weight(head),
            input_ids,
            self.chunk_tokens,
            transform=self.logit_transform,
            dist=distribution,
            targets=targets,
            keep_bytes=self.head_keep_bytes,
            fused=self.fused_head,
        )


def hf_named_tensors(state_dict: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs with Hugging Face names from a state dict of the root
    (``hf.`` prefix); wrapper prefixes (compile, activation checkpointing) removed."""
    pairs = []
    for name, tensor in state_dict.items():
        clean = name.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")
        pairs.append((clean.removeprefix("hf."), tensor))
    return pairs


def load_hf_model(
    model_path: str,
    device: str,
    hf_config_overrides: Mapping[str, Any] | None = None,
    dequantize: bool = False,
) -> nn.Module:
    """fp32 weights from a local HF folder (GPU runs compute in bf16 through FSDP's policy),
    the model built from its config with ``policy.hf_config_overrides`` applied. A
    multimodal wrapper loads whole, its vision part frozen (``multimodal``). ``dequantize``
    (``policy.dequantize_base_checkpoint``): an MXFP4 checkpoint's weights come out of
    transformers' own dequantization (bf16), then fp32 like the rest."""
    from hpcrl.core.backends.automodel.multimodal import auto_model_class, freeze_vision
    from hpcrl.core.models.hf_config import load_hf_config

    config = load_hf_config(model_path, hf_config_overrides or {})
    model_class = auto_model_class(config)
    model = model_class.from_pretrained(
        model_path, config=config, dtype=torch.float32,
        attn_implementation=attention_implementation(model_class, config),
        **dequantized_loading(config, dequantize),
    )  # fmt: skip
    if dequantize:
        model.float()  # dequantized weights arrive in bf16
        forget_dequantization(model)
    freeze_vision(model)
    model.config.use_cache = False
    unfuse_experts(model)
    if device == "cuda":
        model = model.to("cuda")
    return model


def dequantized_loading(config: Any, dequantize: bool) -> dict[str, Any]:
    """from_pretrained's arguments that load ``config``'s checkpoint dequantized: none for an
    unquantized checkpoint (``dequantize`` changes nothing there); ValueError for an MXFP4
    one without ``dequantize`` (validate and the driver refuse it before: architectures)."""
    from hpcrl.config.architectures import DEQUANTIZE, DEQUANTIZED_ON_LOAD, quant_method

    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return {}
    as_dict = quantization if isinstance(quantization, dict) else quantization.to_dict()
    method = quant_method({"quantization_config": as_dict})
    if method not in DEQUANTIZED_ON_LOAD:
        return {}  # other quantized checkpoints load as transformers loads them
    if not dequantize:
        raise ValueError(
            f"{DEQUANTIZE}=False: the checkpoint stores weights in {method.upper()}, which "
            f"the Automodel backend trains only dequantized; set {DEQUANTIZE}=true"
        )
    from transformers import Mxfp4Config

    return {"quantization_config": Mxfp4Config(dequantize=True)}


#: the suffixes of MXFP4 tensors in a checkpoint (``<weight>_blocks``, ``<weight>_scales``)
MXFP4_TENSOR_SUFFIXES = ("_blocks", "_scales")


def forget_dequantization(model: Any) -> None:
    """transformers 5 records the conversions it loaded the checkpoint with, and
    ``revert_weight_conversion`` (refit, export: ``expert_layout.checkpoint_named_tensors``)
    undoes them: the dequantization's would turn the bf16 weights back into MXFP4 names.
    The weights leave unquantized, under the names the dequantization gave them."""
    conversions = getattr(model, "_weight_conversions", None)
    if not conversions:
        return  # transformers 4: no record
    model._weight_conversions = [
        conversion for conversion in conversions
        if not any(str(pattern).endswith(MXFP4_TENSOR_SUFFIXES)
                   for pattern in getattr(conversion, "source_patterns", ()))
    ]  # fmt: skip


def drop_quantization(config: Any) -> Any:
    """``config`` without its ``quantization_config``: the weights written beside it are the
    dequantized ones training holds, which a reader must not take for MXFP4 blocks."""
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    return config


def attention_implementation(auto_class: Any, config: Any) -> str:
    """SDPA where transformers offers it for the class ``auto_class`` builds from ``config``,
    else its eager attention: gpt-oss's attention sinks (one learned logit per head beside
    the keys) have no SDPA form in transformers."""
    model_class = auto_class._model_mapping[type(config)]
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
