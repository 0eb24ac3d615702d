"""Turning data rows into token ids: prompts for GRPO, prompt+response examples for SFT."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcrl.config.recipe import TokenizerCfg


def load_tokenizer(model_path: str, cfg: TokenizerCfg) -> Any:
    """The tokenizer named by ``policy.tokenizer.name`` (default: the model's own)."""
    from hpcrl.core.models.tokenizer import load_tokenizer as load_by_name

    tokenizer = load_by_name(cfg.name or model_path)
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def encode_prompt(tokenizer: Any, text: str, use_chat_template: bool) -> list[int]:
    """Prompt token ids; as a single user turn when the tokenizer has a chat template."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
            )
        )
    return list(tokenizer(text)["input_ids"])


def truncate_left(ids: Sequence[int], max_len: int | None) -> list[int]:
    """Keep the last ``max_len`` tokens (the end of a prompt is what the answer follows)."""
    ids = list(ids)
    return ids if max_len is None or len(ids) <= max_len else ids[-max_len:]


def encode_sft_example(
    tokenizer: Any, prompt: str, response: str, max_len: int, use_chat_template: bool
) -> tuple[list[int], list[float]]:
    """(input_ids, token_mask): prompt then response then EOS; the mask covers the response
    and EOS only. Truncated on the right to ``max_len``."""
    prompt_ids = encode_prompt(tokenizer, prompt, use_chat_template)
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response_ids.append(tokenizer.eos_token_id)
    ids = (prompt_ids + response_ids)[:max_len]
    mask = ([0.0] * len(prompt_ids) + [1.0] * len(response_ids))[:max_len]
    return ids, mask
