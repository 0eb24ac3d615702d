"""Distributed checkpoints (torch DCP) and consolidated HF export for the Automodel backend.

Layout of one checkpoint folder (shared by all ranks):
  dcp/               model + optimizer, sharded, written by every rank (torch DCP)
  rank_00000.pt ...  per rank: scheduler state, optimizer step, RNG states
  extra_state.json   the controller's (data position, ...), written by RayPolicy
"""

from __future__ import annotations

import copy
import os
import random
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

DCP_SUBDIR = "dcp"


def rank_file(checkpoint_dir: str, rank: int) -> str:
    return os.path.join(checkpoint_dir, f"rank_{rank:05d}.pt")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _state_options(adapters_only: bool) -> StateDictOptions:
    """``adapters_only`` (LoRA): the trained parameters only, the frozen base weights come
    from the model folder on load (load is not strict about them, ``dcp.load`` is about
    every adapter tensor it is asked for)."""
    return StateDictOptions(ignore_frozen_params=adapters_only, strict=not adapters_only)


def save(
    checkpoint_dir: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    *,
    adapters_only: bool = False,
) -> None:
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_state_options(adapters_only))
    dcp.save(
        {"model": model_sd, "optim": optim_sd},
        checkpoint_id=os.path.join(checkpoint_dir, DCP_SUBDIR),
    )
    local = {"scheduler": scheduler.state_dict(), "step": step, "rng": rng_state()}
    torch.save(local, rank_file(checkpoint_dir, dist.get_rank()))
    dist.barrier()


def load(
    checkpoint_dir: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    *,
    adapters_only: bool = False,
) -> int:
    """Restore in place; returns the optimizer step count saved.

    The layout may differ from the one that saved (world size, FSDP/HSDP/TP mesh): DCP reshards
    model and optimizer state to this run's placements. Scheduler and step are the same on
    every saved rank; each rank takes them, with its RNG states, from saved rank
    ``rank % saved_world_size`` (its own file when the world size is unchanged).
    """
    saved_world_size = len(_saved_rank_files(checkpoint_dir))
    # get_state_dict on a fresh optimizer creates its state, which dcp.load then fills.
    options = _state_options(adapters_only)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=os.path.join(checkpoint_dir, DCP_SUBDIR))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options,
    )
    rank = dist.get_rank()
    local = torch.load(rank_file(checkpoint_dir, rank % saved_world_size), weights_only=False)
    scheduler.load_state_dict(local["scheduler"])
    set_rng_state(local["rng"])
    if rank == 0 and saved_world_size != dist.get_world_size():
        print(
            f"[hpcrl checkpoint] {checkpoint_dir} was written by {saved_world_size} workers, "
            f"loaded by {dist.get_world_size()}: model and optimizer resharded; rank r takes "
            f"the RNG states of saved rank r % {saved_world_size}",
            flush=True,
        )
    return int(local["step"])


def _saved_rank_files(checkpoint_dir: str) -> list[str]:
    """rank_00000.pt .. rank_<N-1>.pt, checked to be complete (one per saved rank)."""
    names = sorted(
        n for n in os.listdir(checkpoint_dir) if n.startswith("rank_") and n.endswith(".pt")
    )
    expected = [os.path.basename(rank_file(checkpoint_dir, r)) for r in range(len(names))]
    if not names or names != expected:
        raise FileNotFoundError(
            f"{checkpoint_dir}: per-rank files {names or 'missing'}, expected rank_00000.pt "
            "onwards, one per saved worker; point at a folder written by save_checkpoint"
        )
    return names


def export_hf(
    out_dir: str,
    model: torch.nn.Module,
    hf_config: Any,
    tokenizer_path: str,
    prefix: str,
    *,
    lora_scale: float | None = None,
    gathered: dict[str, torch.Tensor] | None = None,
) -> None:
    """Gather full weights to rank 0 (on CPU) and write a HF checkpoint + tokenizer there;
    ``lora_scale`` set: LoRA adapters merged into the weights they adapt (a plain HF model).
    ``gathered``: the full weights with HF names already on every rank (expert parallelism
    gathers its experts itself), used instead of the model's state dict."""
    from hpcrl.core.backends.automodel.expert_layout import fuse_expert_tensors, unfuse_experts
    from hpcrl.core.backends.automodel.lora import merge_adapters
    from hpcrl.core.backends.automodel.model import drop_quantization
    from hpcrl.core.backends.automodel.multimodal import auto_model_class
    from hpcrl.core.models.tokenizer import load_tokenizer

    if gathered is None:
        full = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
    if dist.get_rank() == 0:
        weights = (
            {key: value.cpu() for key, value in gathered.items()}
            if gathered is not None
            else {key.removeprefix(prefix): value for key, value in full.items()}
        )
        if lora_scale is not None:
            weights = dict(merge_adapters(weights.items(), lora_scale))
        config = drop_quantization(copy.deepcopy(hf_config))
        config.use_cache = True  # training switched it off; whoever generates wants it
        with torch.device("meta"):
            hf_model = auto_model_class(config).from_config(config, dtype=torch.float32)
        # the per-expert names training keeps, save_pretrained the checkpoint's (expert_layout.py)
        unfuse_experts(hf_model, keep_fused_on_disk=True)
        weights = dict(fuse_expert_tensors(hf_model, list(weights.items())))
        hf_model.load_state_dict(weights, assign=True, strict=True)
        hf_model.tie_weights()
        hf_model.save_pretrained(out_dir)
        load_tokenizer(tokenizer_path).save_pretrained(out_dir)
    dist.barrier()


@torch.no_grad()
def full_hf_weights(
    model: Any, ep_mesh: Any, lora_scale: float | None, model_path: str
) -> list[tuple[str, torch.Tensor]]:
    """Full weights of the training root with Hugging Face names on every rank (gathering
    FSDP/TP shards is a collective), on this rank's device. ``cpu_offload`` stays off: with
    it only rank 0 would receive tensors, and every rank feeds its own engine. ``ep_mesh``:
    experts gathered over it; ``lora_scale``: adapters merged at that scale."""
    from hpcrl.core.backends.automodel.expert_parallel import gather_expert_tensors
    from hpcrl.core.backends.automodel.lora import merge_adapters
    from hpcrl.core.backends.automodel.model import hf_named_tensors
    from hpcrl.core.backends.automodel.multimodal import in_checkpoint_layout, saved_key_names

    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=False)
    )
    named = [(name, tensor.detach()) for name, tensor in hf_named_tensors(state)]
    if ep_mesh is not None:
        named = gather_expert_tensors(named, model.hf.expert_layout, ep_mesh.get_group("ep"))
    merged = named if lora_scale is None else merge_adapters(named, lora_scale)
    return in_checkpoint_layout(model.hf, merged, saved_key_names(model_path))
