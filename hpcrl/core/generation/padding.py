"""The padding every generation engine shares: prompts left-padded into a batch
(``pad_prompts``), and prompt plus generated tokens assembled right-padded as
``hpcrl.core.policy.GenerationOutput`` describes (``assemble_right_padded``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


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
