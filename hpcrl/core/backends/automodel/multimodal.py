"""Checkpoints whose Hugging Face architecture wraps a text decoder in a multimodal model
(``MULTIMODAL_TEXT_MODEL_TYPES`` in hpcrl.config.architectures: Gemma 3's and Mistral 3's
``...ForConditionalGeneration``), trained on text.

NeMo RL loads these with ``AutoModelForImageTextToText`` (its ``AUTOMODEL_FACTORY``) and runs
the whole model on text-only batches, so the vision tower and projector get no gradient and
keep their weights. hpcrl loads the same class, so every checkpoint key (vision included)
loads and is written back; the backend's forward runs only the language model
(``get_decoder()`` and ``get_output_embeddings()``), which on text-only input is what the
wrapper's own forward computes. The vision tower and projector are frozen so the optimizer
holds no state for them.

transformers renames these checkpoints' keys when it loads them (``language_model.model.*``
becomes ``model.language_model.*``) and back when it saves; ``checkpoint_key_names`` applies
the save-side renaming to the weights the backend hands to vLLM, so refit and saved folders
both use the checkpoint's own layout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from hpcrl.config.architectures import MULTIMODAL_TEXT_MODEL_TYPES

#: submodules of the wrapper outside the language model: no gradient on text
_VISION_PARTS = ("vision_tower", "multi_modal_projector", "embed_vision", "audio_tower")


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


def checkpoint_key_names(hf_model: Any) -> Callable[[str], str]:
    """Model state-dict name → the name the checkpoint stores it under: the reverse of
    the class's ``_checkpoint_conversion_mapping``, as ``save_pretrained`` applies it."""
    mapping: Mapping[str, str] = getattr(hf_model, "_checkpoint_conversion_mapping", None) or {}
    reverse = [
        (re.compile("^" + re.escape(loaded.lstrip("^"))), saved.lstrip("^"))
        for saved, loaded in mapping.items()
    ]

    def rename(name: str) -> str:
        for pattern, saved in reverse:
            renamed, count = pattern.subn(saved, name)
            if count:
                return renamed
        return name

    return rename
