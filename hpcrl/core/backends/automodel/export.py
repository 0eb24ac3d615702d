"""An Automodel checkpoint (torch DCP, sharded by FSDP/HSDP/TP) as a Hugging Face folder, in
one process without a process group: only the model's tensors are read (the optimizer's,
usually twice as large, stay on disk), each whole, whatever mesh wrote them.

The checkpoint's model keys are the training root's (``model.hf.<HF name>``, see
``checkpoint.save``); the HF model is built on the meta device from the run's own model
folder (config, and the tokenizer written beside the weights), and the loaded tensors are
assigned to it, so no second copy of the weights is ever made.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from hpcrl.core.backends.automodel.checkpoint import DCP_SUBDIR
from hpcrl.core.backends.automodel.expert_layout import fuse_expert_tensors, unfuse_experts
from hpcrl.core.backends.automodel.model import (
    dequantized_loading,
    drop_quantization,
    hf_named_tensors,
)
from hpcrl.run.export_progress import ExportProgress, gib

MODEL_KEY_PREFIX = "model."


def read_model_tensors(
    checkpoint_dir: str | Path, say: ExportProgress | None = None
) -> dict[str, Any]:
    """Every model tensor of the DCP checkpoint, whole, with Hugging Face names."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    dcp_dir = os.path.join(checkpoint_dir, DCP_SUBDIR)
    metadata = dcp.FileSystemReader(dcp_dir).read_metadata()
    wanted = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_KEY_PREFIX) and isinstance(item, TensorStorageMetadata):
            wanted[key] = torch.empty(item.size, dtype=item.properties.dtype)
    if not wanted:
        raise FileNotFoundError(
            f"{dcp_dir} holds no model tensors: it is not a checkpoint of hpcrl's Automodel "
            "backend (a Megatron run's checkpoint holds megatron/ instead)"
        )
    if say is not None:
        num_bytes = sum(t.numel() * t.element_size() for t in wanted.values())
        say(f"reading {len(wanted)} model tensors ({gib(num_bytes)}) from {dcp_dir}")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(wanted, checkpoint_id=dcp_dir, no_dist=True)
    named = {key.removeprefix(MODEL_KEY_PREFIX): value for key, value in wanted.items()}
    return dict(hf_named_tensors(named))


def export_dcp_to_hf(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    model_path: str,
    tokenizer_path: str,
    say: ExportProgress | None = None,
    lora_scale: float | None = None,
) -> None:
    """Write ``checkpoint_dir``'s weights as a HF folder (safetensors, config, generation
    config, tokenizer) to ``out_dir``, in the dtype training kept them in. ``lora_scale``
    set (a LoRA run, whose checkpoints hold the adapters only): the base weights from
    ``model_path`` with the adapters merged into them."""
    import torch
    from transformers import AutoConfig

    from hpcrl.core.backends.automodel.multimodal import auto_model_class
    from hpcrl.core.models.tokenizer import load_tokenizer

    weights = read_model_tensors(checkpoint_dir, say)
    if lora_scale is not None:
        weights = merged_onto_base(weights, model_path, lora_scale, str(checkpoint_dir), say)
    dtype = next(iter(weights.values())).dtype
    config = drop_quantization(AutoConfig.from_pretrained(model_path))
    with torch.device("meta"):
        model = auto_model_class(config).from_config(config, dtype=dtype)
    # the per-expert names training keeps, save_pretrained the checkpoint's (expert_layout.py)
    unfuse_experts(model, keep_fused_on_disk=True)
    weights = dict(fuse_expert_tensors(model, list(weights.items())))
    missing, unexpected = model.load_state_dict(weights, assign=True, strict=False)
    tied = _tied_names(model)
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ValueError(
            f"{checkpoint_dir} does not fit {model_path}'s architecture: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.tie_weights()
    model.config.use_cache = True  # training switched it off; generation wants it
    if say is not None:
        say(f"writing the Hugging Face folder {out_dir} (safetensors, config, tokenizer)")
    model.save_pretrained(out_dir)
    load_tokenizer(tokenizer_path).save_pretrained(out_dir)


def merged_onto_base(
    adapters: dict[str, Any],
    model_path: str,
    lora_scale: float,
    checkpoint_dir: str,
    say: ExportProgress | None = None,
) -> dict[str, Any]:
    """The base model's weights (fp32, as training loads them) with the checkpoint's LoRA
    adapters merged in: ``W + lora_scale * B @ A``."""
    import torch
    from transformers import AutoConfig

    from hpcrl.core.backends.automodel.lora import adapter_names, merge_adapters
    from hpcrl.core.backends.automodel.multimodal import auto_model_class

    found = adapter_names(adapters)
    if not found:
        raise FileNotFoundError(
            f"{checkpoint_dir} holds no LoRA adapters, yet the run's recipe enables "
            "policy.automodel_cfg.lora_cfg: it was not written by this run"
        )
    if say is not None:
        say(f"merging {len(found) // 2} LoRA adapters into the base weights of {model_path}")
    config = AutoConfig.from_pretrained(model_path)
    # an MXFP4 base loads dequantized, as training loaded it (its recipe had to say so)
    base = (
        auto_model_class(config)
        .from_pretrained(
            model_path, dtype=torch.float32, **dequantized_loading(config, dequantize=True)
        )
        .float()
    )
    unfuse_experts(base)
    named = list(base.state_dict().items()) + [(name, adapters[name]) for name in found]
    return dict(merge_adapters(named, lora_scale))


def _tied_names(model: Any) -> set[str]:
    """The output embedding's weight when it is tied to the input embedding: a checkpoint
    may hold only the input one (``tie_weights`` then shares it)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    output = model.get_output_embeddings()
    return {f"{name}.weight" for name, module in model.named_modules() if module is output}
