"""The Megatron backend's weights with Hugging Face names, for generation engines.

megatron-bridge's ``export_hf_weights`` gathers TP/PP shards (every rank takes part) and
converts names and layouts: the same conversion ``export_hf`` writes to disk. The bridge is
built once from the worker's HF checkpoint and ``policy.hf_config_overrides`` (the config an
export writes beside the weights is the one the run trained).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def build_bridge(model_path: str, hf_config_overrides: Mapping[str, Any]) -> Any:
    from hpcrl.core.backends.megatron.hf_overrides import bridge_with_overrides

    return bridge_with_overrides(model_path, hf_config_overrides)


def export_hf_weights(bridge: Any, model_chunks: list) -> list[tuple[str, torch.Tensor]]:
    """Full HF-named tensors of ``model_chunks`` on every rank (host memory)."""
    # Tensors that need no gather (norms, TP=1 weights) come back as the live parameters on
    # a CPU model; copy those, or the next optimizer step would change an export in place.
    live = {
        param.untyped_storage().data_ptr() for chunk in model_chunks for param in chunk.parameters()
    }
    with torch.no_grad():  # the gathered tensors would otherwise carry autograd history
        exported = bridge.export_hf_weights(model_chunks, cpu=True, show_progress=False)
        return [
            (name, tensor.detach().clone() if _storage(tensor) in live else tensor.detach())
            for name, tensor in exported
        ]


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()
