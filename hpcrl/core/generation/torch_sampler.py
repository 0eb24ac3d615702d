"""hpcrl's torch sampler: one call over a Hugging Face causal LM (the padding helpers every
engine shares are ``hpcrl.core.generation.padding``).

``generate`` copies the model's weights into a ``TorchEngine``
(``hpcrl.core.generation.torch_engine``) and samples with it; jobs keep one engine per
worker instead (``hpcrl.core.generation.engine``). Results are right-padded as
``hpcrl.core.policy.GenerationOutput`` describes; ``generation_logprobs`` are the log-probs of
the sampled tokens in the distribution they were drawn from, ``log_softmax(filter(logits /
T))`` (``hpcrl.core.token_distribution``): the same quantity the trainer's ``get_logprobs``
computes by teacher forcing, so the two can be compared for importance-sampling corrections.
Greedy decoding records temperature-1 values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    tokenizer: Any = None,
) -> dict[str, torch.Tensor]:
    """Sample up to ``cfg.max_new_tokens`` tokens per row of a padded prompt batch.

    ``tokenizer`` is needed only for ``cfg.stop_strings`` (checked on decoded text).
    """
    from hpcrl.core.generation.torch_engine import TorchEngine

    if cfg.stop_strings and tokenizer is None:
        raise ValueError("policy.generation.stop_strings needs a tokenizer to decode responses")
    engine = TorchEngine.from_hf_model(model, tokenizer=tokenizer)
    engine.pad_token_id = pad_token_id
    prompts = [
        row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)
    ]
    stops = () if eos_token_id is None else (eos_token_id,)
    try:
        return engine.generate(prompts, cfg, seed, stop_token_ids=stops)
    finally:
        engine.shutdown()
