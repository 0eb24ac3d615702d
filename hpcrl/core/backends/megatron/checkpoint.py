"""Training checkpoints of the Megatron backend (model + optimizer + scheduler + step).

torch_dist through megatron-core's dist_checkpointing, so a checkpoint saved at one TP/PP/DP
layout loads at another. Loads read with ``checkpoint.parallel_read_threads`` threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _sharded_state(worker: Any) -> dict:
    from megatron.core.utils import unwrap_model

    model_state = {}
    for index, chunk in enumerate(unwrap_model(worker.model_chunks)):
        model_state[f"model{index}"] = chunk.sharded_state_dict()
    return {**model_state, "optimizer": worker.optimizer.sharded_state_dict(model_state)}


def save_training_state(worker: Any, checkpoint_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    path = Path(checkpoint_dir) / "megatron"
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(worker), str(path))
    if dist.get_rank() == 0:
        torch.save({"scheduler": worker.scheduler.state_dict(), "steps_done": worker.steps_done},
                   path / "scheduler.pt")
    dist.barrier()


def load_training_state(worker: Any, checkpoint_dir: str) -> None:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.utils import unwrap_model

    from hpcrl.core.backends.megatron.parallel_read import parallel_reads

    path = Path(checkpoint_dir) / "megatron"
    with parallel_reads(worker.cfg.checkpoint.parallel_read_threads):
        loaded = dist_checkpointing.load(_sharded_state(worker), str(path))
    for index, chunk in enumerate(unwrap_model(worker.model_chunks)):
        chunk.load_state_dict(loaded[f"model{index}"], strict=False)
    worker.optimizer.load_state_dict(loaded["optimizer"])
    extra = torch.load(path / "scheduler.pt", weights_only=False)
    worker.scheduler.load_state_dict(extra["scheduler"])
    worker.steps_done = extra["steps_done"]
