"""Context parallelism (CP) for the Automodel backend: the ranks of one CP group hold
different parts of the same sequences (``policy.automodel_cfg.context_parallel_size``).

Layout (load-balanced as NeMo RL and Megatron do it): a micro-batch's sequence dim is padded
to a multiple of 2 × CP and cut into 2 × CP chunks; CP rank r holds chunks r and 2·CP−1−r, so
under causal attention every rank does the same amount of work. The model gets each token's
global position (rotary embeddings are the whole sequence's).

Attention sees the whole sequence: ``apply_context_parallel`` switches the model to an
attention function registered with transformers' ``AttentionInterface`` that all-gathers K
and V over the CP group (an autograd all-gather: its backward sums each rank's gradient
contributions back to the rank that owns the piece) and masks by global
position. torch's ring attention (``torch.distributed.tensor.experimental.context_parallel``)
runs only SDPA's CUDA flash/efficient kernels; this path runs on every device.

Log-probs: each rank scores its own tokens against their global next token; the scores are
all-gathered (autograd too) and put back in sequence order, so the loss function sees the
whole micro-batch exactly as without CP. Every CP rank then computes the same loss; the
all-gathers' backward makes each rank's gradient CP × its share, and FSDP's average over
dp × cp ranks divides the CP back out: the worker scales the loss by the data-parallel size
only, as without CP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from hpcrl.core.cp_gather import gather_summed

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from hpcrl.config.recipe import Recipe
    from hpcrl.core.token_distribution import TokenDistribution

# The name the attention function is registered under (``config._attn_implementation``).
ATTENTION_NAME = "hpcrl_context_parallel"


def load_balanced_positions(seq_len: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Global positions rank ``cp_rank`` holds: chunks r and 2·CP−1−r of 2·CP equal chunks."""
    if seq_len % (2 * cp_size):
        raise ValueError(f"sequence length {seq_len} is not a multiple of 2 x CP = {2 * cp_size}")
    chunk = seq_len // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    last_index = 2 * cp_size - 1 - cp_rank
    second = torch.arange(last_index * chunk, (last_index + 1) * chunk)
    return torch.cat([first, second])


@attrs.frozen(kw_only=True)
class ContextParallelInputs:
    """What the attention function needs for one micro-batch (handed down by transformers
    as a keyword argument, so activation checkpointing's recompute sees the same one).

    ``key_positions``: global positions of the all-gathered keys (rank 0's, then rank 1's, …);
    ``key_valid``: [B, S] per gathered key, False for padding; None: causal order alone."""

    group: ProcessGroup
    query_positions: torch.Tensor
    key_positions: torch.Tensor
    key_valid: torch.Tensor | None


def gather_keys_values(
    key: torch.Tensor, value: torch.Tensor, cp: ContextParallelInputs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole sequence's K and V ([B, kv_heads, S, D], in CP rank order) and the global
    position of each gathered key."""
    keys = gather_summed(key, 2, cp.group)
    values = gather_summed(value, 2, cp.group)
    return keys, values, cp.key_positions


def to_sequence_order(gathered: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """[B, S, ...] in CP rank order (``key_positions``) → [B, S, ...] in sequence order."""
    return gathered[:, torch.argsort(key_positions)]


def context_parallel_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    context_parallel: ContextParallelInputs | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """SDPA over the whole sequence's keys and values ([B, heads, S_local, D] in, HF's
    attention-function contract). Without ``context_parallel`` (a forward outside CP): SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if context_parallel is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    cp = context_parallel
    keys, values, key_pos = gather_keys_values(key, value, cp)
    query_pos = cp.query_positions.to(query.device)
    key_pos = key_pos.to(query.device)
    causal = key_pos[None, :] <= query_pos[:, None]  # [S_local, S]
    mask = causal[None, None]
    if cp.key_valid is not None:
        # A padding query may see no valid key: it keeps itself (finite, and never counted).
        itself = key_pos[None, :] == query_pos[:, None]
        valid = cp.key_valid.to(query.device)[:, None, None, :]
        mask = causal[None, None] & (valid | itself[None, None])
    kwargs.pop("is_causal", None)
    window = kwargs.pop("sliding_window", None)
    if window is not None:  # transformers' sliding window: keys within the last ``window``
        recent = key_pos[None, :] > query_pos[:, None] - window
        mask = mask & recent[None, None]
    return sdpa_attention_forward(
        module, query, keys, values, mask, *args, is_causal=False, **kwargs
    )


def check_context_parallel(recipe: Recipe) -> None:
    """What CP does not run with (the config rule
    ``hpcrl.config.rules:rule_automodel_context_parallel`` says why, before the queue wait)."""
    cfg = recipe.policy.automodel_cfg
    if cfg.context_parallel_size <= 1:
        return
    if recipe.policy.sequence_packing.enabled:
        raise ValueError(
            "policy.automodel_cfg.context_parallel_size > 1 does not run with "
            "policy.sequence_packing; set policy.sequence_packing.enabled=false"
        )
    if cfg.sequence_parallel and cfg.tensor_parallel_size > 1:
        raise ValueError(
            "policy.automodel_cfg.context_parallel_size > 1 does not run with "
            "sequence_parallel at tensor_parallel_size > 1; set sequence_parallel=false"
        )
    if cfg.expert_parallel_size > 1:
        raise ValueError(
            "policy.automodel_cfg.context_parallel_size > 1 does not run with "
            "expert_parallel_size > 1; set expert_parallel_size=1"
        )


def apply_context_parallel(hf_model: Any) -> None:
    """Make ``hf_model``'s attention the context-parallel one (registered with transformers
    once per process; a forward without ``context_parallel`` inputs still runs plain SDPA)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, context_parallel_attention)
    hf_model.set_attn_implementation(ATTENTION_NAME)


def context_parallel_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    group: ProcessGroup,
    distribution: TokenDistribution | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) log-probs [B, S] of the whole micro-batch, as
    ``TokenLogprobModel`` computes them without CP (``out[:, 0] = 0``); this rank runs only
    its own positions. ``attention_mask`` None: causal order alone (right-padded rows)."""
    import torch.distributed as dist

    cp_size, cp_rank = dist.get_world_size(group), dist.get_rank(group)
    batch, seq_len = input_ids.shape
    device = input_ids.device
    local = load_balanced_positions(seq_len, cp_size, cp_rank).to(device)
    keys = torch.cat([load_balanced_positions(seq_len, cp_size, r) for r in range(cp_size)]).to(
        device
    )
    inputs = ContextParallelInputs(
        group=group,
        query_positions=local,
        key_positions=keys,
        key_valid=None if attention_mask is None else attention_mask[:, keys].bool(),
    )
    # Each local token is scored against the token after it in the whole sequence; the last
    # position has none (its score is dropped below).
    targets = input_ids[:, (local + 1).clamp(max=seq_len - 1)]
    processed, unfiltered = model(
        input_ids[:, local],
        None,
        distribution=distribution,
        position_ids=local.expand(batch, -1),
        targets=targets,
        context_parallel=inputs,
    )
    gathered = gather_summed(torch.stack([processed, unfiltered], dim=-1), 1, group)
    in_order = to_sequence_order(gathered, keys)  # [B, S, 2]: entry p scores token p + 1
    first = torch.zeros(batch, 1, 2, dtype=in_order.dtype, device=device)
    both = torch.cat([first, in_order[:, :-1]], dim=1)
    return both[..., 0], both[..., 1]
