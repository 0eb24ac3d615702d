"""hpcrl's own batched sampler: a Hugging Face causal LM with its KV cache, no grad.

Prompts come in padded either way (the attention mask says where the tokens are); they are
left-padded internally so that one decode step appends one token to every row, and the
result comes back right-padded as ``hpcrl.core.policy.GenerationOutput`` describes.

``generation_logprobs`` are the log-probs of the sampled tokens in the distribution they were
drawn from: ``log_softmax(filter(logits / T))`` (``hpcrl.core.token_distribution``), the
same quantity the trainer's ``get_logprobs`` computes by teacher forcing, so the two can be
compared for importance-sampling corrections. Greedy decoding records temperature-1 values.

When the model is sharded (FSDP), every rank must run the same number of forward calls:
with ``sync_group`` the ranks all-reduce an "any row unfinished" flag every step and keep
stepping (with finished rows padded) until no rank has work left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcrl.core.token_distribution import TokenDistribution, processed_logits

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg


def generate(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cfg: GenerationCfg,
    *,
    seed: int,
    eos_token_id: int | None,
    pad_token_id: int,
    sync_group: Any = None,
    tokenizer: Any = None,
) -> dict[str, torch.Tensor]:
    """Sample up to ``cfg.max_new_tokens`` tokens per row; returns GenerationOutput's fields.

    ``tokenizer`` is needed only for ``cfg.stop_strings`` (checked on decoded text).
    """
    import torch

    if cfg.stop_strings and tokenizer is None:
        raise ValueError("policy.generation.stop_strings needs a tokenizer to decode responses")
    device = _model_device(model)
    prompt_lengths = attention_mask.sum(dim=1).to(torch.long)
    left_ids, left_mask = left_pad(input_ids, attention_mask, pad_token_id)
    stop_ids = set(cfg.stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    with torch.no_grad():
        tokens, logprobs, lengths = _decode_loop(
            model,
            left_ids.to(device),
            left_mask.to(device),
            cfg,
            generator=generator,
            stop_ids=stop_ids,
            pad_token_id=pad_token_id,
            sync_group=sync_group,
            tokenizer=tokenizer,
        )
    return assemble_right_padded(
        input_ids, attention_mask, prompt_lengths, tokens, logprobs, lengths, pad_token_id
    )


def _model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def left_pad(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's real tokens to the right end (order kept)."""
    import torch

    batch, width = input_ids.shape
    lengths = attention_mask.sum(dim=1).tolist()
    out_ids = torch.full((batch, width), pad_token_id, dtype=input_ids.dtype)
    out_mask = torch.zeros((batch, width), dtype=attention_mask.dtype)
    for row, length in enumerate(lengths):
        real = input_ids[row][attention_mask[row].bool()]
        out_ids[row, width - length :] = real
        out_mask[row, width - length :] = 1
    return out_ids, out_mask


def _decode_loop(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    cfg: GenerationCfg,
    *,
    generator: torch.Generator,
    stop_ids: set[int],
    pad_token_id: int,
    sync_group: Any,
    tokenizer: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill then one token per step; returns tokens [B, N], logprobs [B, N], lengths [B]."""
    import torch

    batch = ids.shape[0]
    device = ids.device
    distribution = TokenDistribution.of_generation(cfg)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    out = _prefill(model, ids, mask, positions)
    past, next_logits = out.past_key_values, out.logits[:, -1, :].float()
    next_position = positions[:, -1:] + 1
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    stop_tensor = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    for step in range(cfg.max_new_tokens):
        if not _any_unfinished(finished, sync_group):
            break
        processed = processed_logits(next_logits, distribution)
        chosen = sample_tokens(processed, cfg, generator)
        chosen_logprobs = torch.log_softmax(processed, dim=-1).gather(1, chosen[:, None])[:, 0]
        active = ~finished
        tokens.append(torch.where(active, chosen, pad_token_id))
        logprobs.append(torch.where(active, chosen_logprobs, 0.0))
        lengths += active.long()
        finished |= active & torch.isin(chosen, stop_tensor)
        if cfg.stop_strings:
            finished |= _hit_stop_string(torch.stack(tokens, dim=1), lengths, cfg, tokenizer)
        if step + 1 == cfg.max_new_tokens:
            break
        mask = torch.cat([mask, active.long()[:, None].to(mask.dtype)], dim=1)
        out = model(
            input_ids=tokens[-1][:, None],
            attention_mask=mask,
            position_ids=next_position,
            past_key_values=past,
            use_cache=True,
        )
        past, next_logits = out.past_key_values, out.logits[:, -1, :].float()
        next_position = next_position + 1
    if not tokens:
        empty = torch.zeros((batch, 0), device=device)
        return empty.long(), empty, lengths
    return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), lengths


def _prefill(model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> Any:
    """First forward over the prompts. Only the last position's logits are needed: asking
    for just those avoids a [B, P, vocab] tensor (GBs for long prompts and big vocabularies)."""
    kwargs = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        "use_cache": True,
    }
    try:
        return model(**kwargs, logits_to_keep=1)
    except TypeError as error:  # a model class without logits_to_keep
        if "logits_to_keep" not in str(error):
            raise
        return model(**kwargs)


def _any_unfinished(finished: torch.Tensor, sync_group: Any) -> bool:
    import torch

    flag = (~finished).any().to(torch.int32).reshape(1)
    if sync_group is not None:
        import torch.distributed as dist

        flag = flag.cpu() if dist.get_backend(sync_group) == "gloo" else flag
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=sync_group)
    return bool(flag.item())


def sample_tokens(
    processed: torch.Tensor, cfg: GenerationCfg, generator: torch.Generator
) -> torch.Tensor:
    """One token id per row from ``processed_logits``: argmax when temperature == 0."""
    import torch

    if cfg.temperature == 0:
        return processed.argmax(dim=-1)
    probs = torch.softmax(processed, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]


def _hit_stop_string(
    tokens: torch.Tensor, lengths: torch.Tensor, cfg: GenerationCfg, tokenizer: Any
) -> torch.Tensor:
    import torch

    hits = [
        any(stop in tokenizer.decode(row[:length].tolist()) for stop in cfg.stop_strings)
        for row, length in zip(tokens.cpu(), lengths.tolist(), strict=True)
    ]
    return torch.tensor(hits, dtype=torch.bool, device=tokens.device)


def assemble_right_padded(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    response_lengths: torch.Tensor,
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    """Rows of prompt + response, right-padded, with the masks policy.py defines (CPU)."""
    import torch

    tokens, logprobs, response_lengths = tokens.cpu(), logprobs.cpu(), response_lengths.cpu()
    totals = prompt_lengths + response_lengths
    batch, width = prompt_ids.shape[0], int(totals.max().item()) if len(totals) else 0
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    response_mask = torch.zeros((batch, width), dtype=torch.long)
    gen_logprobs = torch.zeros((batch, width), dtype=torch.float32)
    for row in range(batch):
        p_len, r_len = int(prompt_lengths[row]), int(response_lengths[row])
        input_ids[row, :p_len] = prompt_ids[row][prompt_mask[row].bool()]
        input_ids[row, p_len : p_len + r_len] = tokens[row, :r_len]
        attention_mask[row, : p_len + r_len] = 1
        response_mask[row, p_len : p_len + r_len] = 1
        gen_logprobs[row, p_len : p_len + r_len] = logprobs[row, :r_len]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        "generation_logprobs": gen_logprobs,
        "prompt_lengths": prompt_lengths.to(torch.long),
        "response_lengths": response_lengths.to(torch.long),
    }


def pad_prompts(
    prompt_ids: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists into (input_ids, attention_mask) tensors for ``generate``."""
    import torch

    width = max((len(ids) for ids in prompt_ids), default=0)
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask
