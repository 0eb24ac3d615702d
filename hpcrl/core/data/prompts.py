"""Turning data rows into token ids: prompts for GRPO, prompt+response examples for SFT."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcrl.config.recipe import TokenizerCfg


def load_tokenizer(model_path: str, cfg: TokenizerCfg) -> Any:
    """The tokenizer named by ``policy.tokenizer.name`` (default: the model's own)."""
    from hpcrl.core.models.tokenizer import load_tokenizer as load_by_name

    tokenizer = load_by_name(cfg.name or model_path)
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def encode_prompt(
    tokenizer: Any,
    text: str,
    use_chat_template: bool,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Prompt token ids; as a single user turn when the tokenizer has a chat template (with
    ``policy.tokenizer.chat_template_kwargs``: ``template_kwargs``)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                tokenize=True,
                add_generation_prompt=True,
                # transformers 5 returns a BatchEncoding by default, 4 a list of ids
                return_dict=False,
                **(template_kwargs or {}),
            )
        )
    return list(tokenizer(text)["input_ids"])


# NeMo RL's data processors cut a prompt that does not fit to this many tokens (per message).
OVERLONG_PROMPT_STUB_TOKENS = 4


def prompt_length_limit(max_input_seq_length: int | None, context: int) -> int:
    """The prompt length at and above which a prompt does not fit: ``data.max_input_seq_length``
    (NeMo RL's threshold), at most the generation engine's ``context`` (a prompt must leave
    room for at least one generated token)."""
    if max_input_seq_length is None:
        return context
    return min(max_input_seq_length, context)


def fit_prompt(ids: Sequence[int], limit: int) -> tuple[list[int], float]:
    """(prompt ids, loss multiplier), as NeMo RL's data processors do it: a prompt of at least
    ``limit`` tokens is cut to its first ``min(4, limit)`` tokens and gets loss multiplier 0
    (its responses are still generated and scored, and count in their group's baseline, but
    never in the loss); any other prompt is kept whole with multiplier 1."""
    ids = list(ids)
    if len(ids) < limit:
        return ids, 1.0
    return ids[: min(OVERLONG_PROMPT_STUB_TOKENS, limit)], 0.0


def prompt_key(ids: Sequence[int], pad_token_id: int | None) -> tuple[int, ...]:
    """What makes two prompts the same prompt: their token ids. NeMo RL compares right-padded
    rows (pad_token_id), so trailing pad tokens do not tell prompts apart; dropped here."""
    key = list(ids)
    while key and pad_token_id is not None and key[-1] == pad_token_id:
        key.pop()
    return tuple(key)


def encode_sft_example(
    tokenizer: Any,
    prompt: str,
    response: str,
    max_len: int,
    use_chat_template: bool,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[int], list[float]]:
    """(input_ids, token_mask): prompt then response then EOS; the mask covers the response
    and EOS only. Truncated on the right to ``max_len``."""
    prompt_ids = encode_prompt(tokenizer, prompt, use_chat_template, template_kwargs)
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response_ids.append(tokenizer.eos_token_id)
    ids = (prompt_ids + response_ids)[:max_len]
    mask = ([0.0] * len(prompt_ids) + [1.0] * len(response_ids))[:max_len]
    return ids, mask
