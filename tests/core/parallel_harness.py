"""Shared pieces of the worker-group and parallelism tests (their fixtures ``ray_cluster`` and
``tiny_model_path`` are in tests/conftest.py): a recipe for the tiny model, a deterministic
batch, a masked-NLL loss and a single-process reference.

The reference is deliberately independent of the backend's code: plain HF forward, full
log_softmax, ``torch.nn.utils.clip_grad_norm_``, AdamW — no FSDP, no chunking.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hpcrl.config.recipe import (
    Recipe,
)
from hpcrl.core.workers.actor import TrainingWorker

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_batch(seed: int, batch_size: int = 8, seq_len: int = 16, vocab: int = 100) -> dict:
    """Right-padded random sequences; the loss counts the second half of each row."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab, (batch_size, seq_len), generator=gen)
    lengths = torch.randint(seq_len // 2 + 2, seq_len + 1, (batch_size,), generator=gen)
    positions = torch.arange(seq_len)[None, :]
    attention_mask = (positions < lengths[:, None]).long()
    input_ids = torch.where(attention_mask.bool(), input_ids, 0)
    token_mask = (attention_mask.bool() & (positions >= seq_len // 2)).float()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_mask": token_mask}


def masked_nll_loss(
    logprobs: torch.Tensor, batch: dict, num_global_tokens: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level NLL over ``token_mask``, a share of the global-batch mean."""
    mask = batch["token_mask"].to(logprobs.dtype)
    loss = -(logprobs * mask).sum() / num_global_tokens
    return loss, {"num_tokens": float(mask.sum())}


def reference_logprobs(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    picked = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(
        -1, batch["input_ids"][:, 1:, None]
    )[..., 0]
    return torch.cat([torch.zeros(picked.shape[0], 1), picked], dim=1)


def reference_training(
    model_path: str, recipe: Recipe, batches: list[dict]
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses per step and final weights of a single process on the same batches."""
    losses, _, weights = reference_training_with_norms(model_path, recipe, batches)
    return losses, weights


def reference_training_with_norms(
    model_path: str, recipe: Recipe, batches: list[dict]
) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """Losses and gradient norms (before clipping) per step, and final weights."""
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.expert_layout import unfuse_experts

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    unfuse_experts(model)  # the layout the backend trains (expert_layout.py)
    cfg = recipe.policy.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    losses, norms = [], []
    for batch in batches:
        num_tokens = float(batch["token_mask"].sum())
        loss, _ = masked_nll_loss(reference_logprobs(model, batch), batch, num_tokens)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.policy.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


class DiagnosticWorker(TrainingWorker):
    """Test stand-in for the Ray actor: the real ``TrainingWorker`` plus ``run``, which lets a
    test look inside a rank's backend (shards, GC state, environment). Production actors have
    no such hook; ``start_policy`` spawns this class through ``RayPolicy(actor_class=...)``."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(backend, *args)`` on this rank."""
        return fn(self._backend, *args)


def full_weights(backend: object) -> dict[str, torch.Tensor]:
    """Run on every rank through ``RayWorkerGroup.call_same('run', ...)``: full weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(
        backend.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {key.removeprefix("hf."): value for key, value in full.items()}


def local_shards(backend: object) -> dict[str, torch.Tensor]:
    """This rank's local parameter shards (to compare HSDP replicas)."""
    return {
        name: param.to_local().detach().clone() for name, param in backend.model.named_parameters()
    }


def start_policy(recipe: Recipe, model_path: str, world_size: int, engine_ranks: int = 1):
    """``engine_ranks``: ranks per colocated vLLM engine (``JobSpec.colocated_engine_ranks``)."""
    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.workers.group import GroupLayout
    from hpcrl.core.workers.ray_policy import RayPolicy

    layout = GroupLayout(
        num_nodes=1, workers_per_node=world_size, device="cpu", engine_ranks=engine_ranks
    )
    return RayPolicy(
        recipe, model_path, layout, worker_class_path(recipe.backend), actor_class=DiagnosticWorker
    )
