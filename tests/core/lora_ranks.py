"""What each spawned gloo rank of ``test_lora_fsdp.py`` runs (``tests/megatron/harness.
run_ranks(..., megatron=False)``: children import it by module path): the real Automodel
worker with LoRA under FSDP2, trained, saved, resumed and exported."""

from __future__ import annotations

import os
from typing import Any

import attrs
import torch

LR = 2e-2
NUM_FIT_STEPS = 8
RANK, ALPHA = 4, 8.0


def lora_recipe(model_path: str) -> Any:
    from hpcrl.config.recipe import LoraCfg
    from tests.recipe_builder import tiny_automodel_recipe, with_automodel

    recipe = tiny_automodel_recipe(lr=LR)
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, model_name=model_path))
    # Kaiming-uniform A: NeMo Automodel's "xavier" (U(0, 1)) makes a tiny model's few steps
    # noisy, and the loss test wants a clear fall
    lora = LoraCfg(enabled=True, dim=RANK, alpha=ALPHA, lora_A_init="uniform")
    return with_automodel(recipe, lora_cfg=lora)


def _worker(rank: int, world_size: int, model_path: str) -> Any:
    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo

    info = RankInfo(rank=rank, world_size=world_size, local_rank=rank,
                    local_world_size=world_size, node_rank=0, master_addr="127.0.0.1",
                    master_port=int(os.environ["MASTER_PORT"]), device="cpu")  # fmt: skip
    worker = AutomodelWorker()
    worker.setup(lora_recipe(model_path), info, model_path)
    return worker


def _train(worker: Any, batch: dict) -> float:
    from tests.core.parallel_harness import masked_nll_loss

    # this rank's half of the global batch, in micro-batches of 2
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    rows = batch["input_ids"].shape[0] // world
    mine = {key: value[rank * rows : (rank + 1) * rows] for key, value in batch.items()}
    micro = [{key: value[i : i + 2] for key, value in mine.items()} for i in range(0, rows, 2)]
    return worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))["loss"]


def _adapter_layout(worker: Any) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    layout = {}
    for name, param in worker.model.named_parameters():
        if "lora_" in name:
            assert isinstance(param, DTensor), name
            layout[name] = (str(param.placements), tuple(param.to_local().shape))
    return layout


def _optimizer_state_names(worker: Any) -> tuple[list[str], list[str]]:
    """Names of the parameters the optimizer holds, and of those it keeps state for."""
    names = {id(param): name for name, param in worker.model.named_parameters()}
    held = [names[id(p)] for group in worker.optimizer.param_groups for p in group["params"]]
    stateful = [names[id(p)] for p in worker.optimizer.state if worker.optimizer.state[p]]
    return sorted(held), sorted(stateful)


def train_save_resume_export(rank: int, world_size: int, model_path: str, out: str) -> dict:
    """Fit one batch, save, train two more steps; a fresh worker resumes from the save and
    trains the same two steps; merged refit weights, the in-job export and the full adapter
    tensors come back (rank 0)."""
    from tests.core.parallel_harness import full_weights, make_batch

    fit = make_batch(seed=1)
    later = [make_batch(seed=seed) for seed in (7, 8)]
    worker = _worker(rank, world_size, model_path)
    initial = {k: v.clone() for k, v in full_weights(worker).items() if "lora_" not in k}
    fit_losses = [_train(worker, fit) for _ in range(NUM_FIT_STEPS)]
    held, stateful = _optimizer_state_names(worker)
    layout = _adapter_layout(worker)
    worker.save_checkpoint(os.path.join(out, "ckpt"))
    after = [_train(worker, batch) for batch in later]
    trained = full_weights(worker)
    merged = dict(worker.export_hf_weights())
    worker.export_hf(os.path.join(out, "hf"))
    worker.close()

    resumed_worker = _worker(rank, world_size, model_path)
    resumed_worker.load_checkpoint(os.path.join(out, "ckpt"))
    resumed = [_train(resumed_worker, batch) for batch in later]
    resumed_worker.close()
    result = {"fit": fit_losses, "after": after, "resumed": resumed, "layout": layout,
              "held": held, "stateful": stateful}  # fmt: skip
    if rank == 0:
        result["initial"] = initial
        result["trained"] = trained
        result["merged"] = merged
    return result
