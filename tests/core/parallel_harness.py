"""Shared pieces of the worker-group and parallelism tests: a local Ray cluster, a recipe for
the tiny model, a deterministic batch, a masked-NLL loss and a single-process reference.

The reference is deliberately independent of the backend's code: plain HF forward, full
log_softmax, ``torch.nn.utils.clip_grad_norm_``, AdamW — no FSDP, no chunking.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from hpcrl.config.recipe import (
    AutomodelCfg,
    DataCfg,
    MegatronCfg,
    OptimizerCfg,
    PolicyCfg,
    Recipe,
    SftCfg,
)
from hpcrl.core.workers.actor import TrainingWorker

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A fresh local Ray (never a stale cluster) for one test module."""
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Workers import the loss function below by module path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from hpcrl.core.models.tiny import ensure_tiny_model

    return ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path_factory.mktemp("models")))


def make_recipe(
    *,
    dp_replicate: int = 1,
    tp: int = 1,
    lr: float = 1e-3,
    micro_batch_size: int = 2,
    manual_gc_interval: int = 0,
    activation_checkpointing: bool = False,
) -> Recipe:
    return Recipe(
        policy=PolicyCfg(
            model_name="tiny:qwen2",
            train_global_batch_size=8,
            train_micro_batch_size=micro_batch_size,
            precision="float32",
            max_grad_norm=1.0,
            optimizer=OptimizerCfg(
                name="torch.optim.AdamW", kwargs={"lr": lr, "weight_decay": 0.01}
            ),
            automodel_cfg=AutomodelCfg(
                enabled=True,
                dp_replicate_size=dp_replicate,
                tensor_parallel_size=tp,
                activation_checkpointing=activation_checkpointing,
            ),
            megatron_cfg=MegatronCfg(
                manual_gc=manual_gc_interval > 0, manual_gc_interval=manual_gc_interval
            ),
        ),
        data=DataCfg(train_path="unused.jsonl"),
        sft=SftCfg(max_num_steps=20),
    )


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
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    cfg = recipe.policy.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    losses = []
    for batch in batches:
        num_tokens = float(batch["token_mask"].sum())
        loss, _ = masked_nll_loss(reference_logprobs(model, batch), batch, num_tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.policy.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


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


def with_automodel(recipe: Recipe, **changes: object) -> Recipe:
    automodel = attrs.evolve(recipe.policy.automodel_cfg, **changes)
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=automodel))
