"""Sampling on the Megatron backend: the current Megatron weights refitted into a local
Hugging Face model, then hpcrl's torch sampler (``hpcrl.core.generation.torch_sampler``).

The refit is megatron-bridge's ``export_hf_weights`` (gathers TP/PP shards; every rank takes
part), the same conversion ``export_hf`` writes to disk, streamed into an HF model built once
from the checkpoint's config. Each data-parallel rank then samples its own prompts without
collectives; TP/PP peers of a rank draw the same tokens (same seed, same weights).
"""

from __future__ import annotations

from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HfRefit:
    """A local HF model that mirrors the Megatron weights when ``refresh`` is called."""

    def __init__(self, model_path: str, precision: str, device: torch.device) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        from hpcrl.core.backends.megatron.bridge_compat import import_bridge

        self.bridge = import_bridge().AutoBridge.from_hf_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_config(config, torch_dtype=_DTYPES[precision])
        self.model.to(device).eval().requires_grad_(False)
        self._tied = bool(getattr(config, "tie_word_embeddings", False))

    @torch.no_grad()
    def refresh(self, model_chunks: list) -> Any:
        """Copy the current Megatron weights in (collective over all ranks); returns the model."""
        params = dict(self.model.named_parameters())
        copied = set()
        for name, tensor in self.bridge.export_hf_weights(
            model_chunks, cpu=True, show_progress=False
        ):
            params[name].copy_(tensor)
            copied.add(name)
        missing = set(params) - copied
        if self._tied:
            missing.discard("lm_head.weight")
        assert not missing, f"refit left HF parameters unset: {sorted(missing)}"
        return self.model
