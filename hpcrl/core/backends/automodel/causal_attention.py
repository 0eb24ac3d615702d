"""Causal attention without transformers' mask construction, for decoders whose every layer
attends causally over the whole sequence.

Without an attention mask transformers still derives one from the positions at every
forward: transformers 5 reads ``(packed[:, -1] == 0).all()`` back to the host (the host waits
for the queue to drain at the start of every forward, and the device then waits for the
host: ~0.3-0.45 ms of each training step on an H100, docs/performance.md item 1), and 4.57
builds the [rows, 1, L, L] mask through ``vmap`` (~8 ms a forward of a tiny model on a
2-core CPU). transformers skips mask construction for an attention implementation that is
registered with its ``AttentionInterface`` but not with its mask interface (its rule for
custom kernels): the decoder hands the attention ``None`` and SDPA runs ``is_causal``.
``apply_causal_attention`` switches a model to SDPA under such a name; the passes that need
a mask (a pack's sequences, padding that is not at the right) bring a 4-D one
(``explicit_mask``), which transformers passes through unchanged.

Only for the families in ``CAUSAL_FAMILIES`` and only when their config has no sliding-window
or chunked layer: without mask construction such a layer would attend to everything before
it, silently.
"""

from __future__ import annotations

from typing import Any

import torch

#: the name SDPA is registered under for mask-less causal attention
CAUSAL_ATTENTION = "hpcrl_causal_sdpa"

#: ``config.model_type``s whose decoder layers are plain causal self-attention unless the
#: config says otherwise (``all_layers_causal``)
CAUSAL_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def all_layers_causal(config: Any) -> bool:
    """Whether every decoder layer of ``config``'s model attends causally to every earlier
    token: a family in ``CAUSAL_FAMILIES`` with no sliding-window or chunked layer."""
    if getattr(config, "model_type", None) not in CAUSAL_FAMILIES:
        return False
    layer_types = getattr(config, "layer_types", None) or ()
    if any(kind != "full_attention" for kind in layer_types):
        return False
    if hasattr(config, "use_sliding_window"):  # qwen2/qwen3: a window only when switched on
        if config.use_sliding_window:
            return False
    elif getattr(config, "sliding_window", None) is not None:  # mistral: a window when set
        return False
    return getattr(config, "attention_chunk_size", None) is None


def apply_causal_attention(hf_model: Any) -> bool:
    """Switch ``hf_model`` from SDPA to ``CAUSAL_ATTENTION`` where ``all_layers_causal``;
    returns whether it did. Models on another implementation (eager, context parallelism's)
    keep it."""
    config = hf_model.config
    if config._attn_implementation != "sdpa" or not all_layers_causal(config):
        return False
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(CAUSAL_ATTENTION, sdpa_attention_forward)
    hf_model.set_attn_implementation(CAUSAL_ATTENTION)
    return True


def uses_causal_attention(hf_model: Any) -> bool:
    return hf_model.config._attn_implementation == CAUSAL_ATTENTION


def explicit_mask(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> torch.Tensor:
    """[rows, 1, L, L] bool, True where a query may attend to a key: causal order; within
    one sequence of a pack (a position that does not follow the one before it starts a new
    sequence: transformers' rule); not to padding (``attention_mask`` 0). Every query may
    attend to itself: a padding query with no key left would give SDPA a row of -inf, NaN in
    its output and, through the zero-weighted loss, in the gradients."""
    length = input_ids.shape[1]
    places = torch.arange(length, device=input_ids.device)
    allowed = (places[None, :] <= places[:, None])[None]  # [1, L, L]
    if position_ids is not None:
        before_first = position_ids[:, :1] - 1
        starts = torch.diff(position_ids, prepend=before_first, dim=-1) != 1
        sequence = starts.cumsum(-1)
        allowed = allowed & (sequence[:, :, None] == sequence[:, None, :])
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, :]
    allowed = allowed | torch.eye(length, dtype=torch.bool, device=input_ids.device)
    return allowed.expand(input_ids.shape[0], -1, -1)[:, None]
