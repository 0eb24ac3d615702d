"""Checkpoints whose Hugging Face architecture wraps a text decoder in a multimodal model
(``MULTIMODAL_TEXT_MODEL_TYPES`` in hpcrl.config.architectures: Gemma 3's, Mistral 3's,
Gemma 4's and Qwen3.5 MoE's ``...ForConditionalGeneration``), trained on text.

NeMo RL loads these with ``AutoModelForImageTextToText`` (its ``AUTOMODEL_FACTORY``) and runs
the whole model on text-only batches, so the vision tower and projector get no gradient and
keep their weights. hpcrl loads the same class, so every checkpoint key (vision included)
loads and is written back; the backend's forward runs only the language model
(``get_decoder()`` and ``get_output_embeddings()``), which on text-only input is what the
wrapper's own forward computes. The vision tower and projector are frozen so the optimizer
holds no state for them.

transformers renames these checkpoints' keys when it loads them (``language_model.model.*``
becomes ``model.language_model.*``) and back when it saves; ``checkpoint_key_names`` applies
the save-side renaming to the weights the backend hands to vLLM when the checkpoint is in
that layout, so refit and saved folders both use the checkpoint's own key names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from hpcrl.config.architectures import MULTIMODAL_TEXT_MODEL_TYPES

#: submodules of the wrapper outside the language model: no gradient on text
_VISION_PARTS = ("vision_tower", "multi_modal_projector", "embed_vision", "audio_tower", "visual")


def is_multimodal_wrapper(config: Any) -> bool:
    return getattr(config, "model_type", None) in MULTIMODAL_TEXT_MODEL_TYPES


def auto_model_class(config: Any) -> Any:
    """The transformers Auto class that builds ``config``'s checkpoint as NeMo RL does."""
    import transformers

    if not is_multimodal_wrapper(config):
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForImageTextToText


def freeze_vision(hf_model: Any) -> int:
    """requires_grad off for every parameter outside the language model; how many."""
    frozen = 0
    if not is_multimodal_wrapper(hf_model.config):
        return frozen
    for name, param in hf_model.named_parameters():
        if any(part in name.split(".") for part in _VISION_PARTS):
            param.requires_grad_(False)
            frozen += 1
    return frozen


def saved_key_names(model_path: str) -> set[str]:
    """The tensor names a local checkpoint folder stores (its safetensors index, else the
    header of its one ``model.safetensors``); empty when neither is there."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    folder = Path(model_path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    single = folder / "model.safetensors"
    if not single.is_file():
        return set()
    with safe_open(str(single), "pt") as handle:
        return set(handle.keys())


def checkpoint_key_names(hf_model: Any, saved: set[str]) -> Callable[[str], str]:
    """Model state-dict name → the name the checkpoint (whose names are ``saved``) stores it
    under. transformers 4 loads legacy-layout keys through the class's
    ``_checkpoint_conversion_mapping`` and reverses it on save; a checkpoint in that layout
    gets its names back the same way. One already in the model's layout (what transformers
    5 writes) keeps the model's names."""
    mapping: Mapping[str, str] = getattr(hf_model, "_checkpoint_conversion_mapping", None) or {}
    reverse = [
        (re.compile("^" + re.escape(loaded.lstrip("^"))), saved_as.lstrip("^"))
        for saved_as, loaded in mapping.items()
    ]

    def rename(name: str) -> str:
        for pattern, saved_as in reverse:
            renamed, count = pattern.subn(saved_as, name)
            if count:
                return renamed
        return name

    names = hf_model.state_dict().keys()
    legacy = any(name not in saved and rename(name) in saved for name in names)
    return rename if legacy else str


def in_checkpoint_layout(
    hf_model: Any, named: list[tuple[str, Any]], saved: set[str]
) -> list[tuple[str, Any]]:
    """Full weights with the model's names → the names and tensors the checkpoint stores.
    transformers 5 changes some layouts as it loads (experts fused into one 3D tensor, keys
    moved) and undoes it on save (``revert_weight_conversion``), which this applies too;
    transformers 4 only renames (``checkpoint_key_names``)."""
    from hpcrl.core.backends.automodel.expert_layout import checkpoint_named_tensors

    named = checkpoint_named_tensors(hf_model, named)
    rename = checkpoint_key_names(hf_model, saved)
    return [(rename(name), tensor) for name, tensor in named]
