"""Training checkpoints of the Megatron backend (model + optimizer + scheduler + step).

torch_dist through megatron-core's dist_checkpointing: model weights reshard to any layout;
the distributed optimizer's state is saved ``dp_reshardable`` (its buffers as they are, fully
parallel), so a resume keeps TP/PP (DP may change). Loads read with
``checkpoint.parallel_read_threads`` threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Optimizer buffers as they are (fully parallel, no gathers); reload needs the same TP/PP.
# ("fully_reshardable" fails on load without Apex/TE: torch Adam keeps a per-param
# "step" that format does not save — megatron-core 0.16.)
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded_state(worker: Any, is_loading: bool) -> dict:
    from megatron.core.utils import unwrap_model

    model_state = {}
    for index, chunk in enumerate(unwrap_model(worker.model_chunks)):
        model_state[f"model{index}"] = chunk.sharded_state_dict()
    optimizer_state = worker.optimizer.sharded_state_dict(
        model_state, is_loading=is_loading, metadata=OPTIMIZER_METADATA
    )
    return {**model_state, "optimizer": optimizer_state}


def save_training_state(worker: Any, checkpoint_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    path = Path(checkpoint_dir) / "megatron"
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(worker, is_loading=False), str(path))
    if dist.get_rank() == 0:
        torch.save(
            {"scheduler": worker.scheduler.state_dict(), "steps_done": worker.steps_done},
            path / "scheduler.pt",
        )
    dist.barrier()


def release_writer_results_queue() -> None:
    """Stop the helper process megatron-core's torch_dist writer keeps after a save.

    The writer caches a spawn-context ``Manager`` (for its results queue) in a module global
    for the rest of the process; only a normal interpreter exit stops it. Ranks that end with
    ``os._exit`` or a kill (Ray actors, test ranks) left one such process per rank running
    forever. Same global in megatron-core 0.16 and 0.19; absent elsewhere, this does nothing.
    """
    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:
        return
    queue = getattr(filesystem_async, "_results_queue", None)
    if queue is None:
        return
    filesystem_async._results_queue = None
    manager = getattr(queue, "_manager", None)
    if manager is not None:
        manager.shutdown()


def load_training_state(worker: Any, checkpoint_dir: str) -> None:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.utils import unwrap_model

    from hpcrl.core.backends.megatron.parallel_read import parallel_reads

    path = Path(checkpoint_dir) / "megatron"
    _create_optimizer_state(worker.optimizer)
    with parallel_reads(worker.cfg.checkpoint.parallel_read_threads):
        loaded = dist_checkpointing.load(_sharded_state(worker, is_loading=True), str(path))
    for index, chunk in enumerate(unwrap_model(worker.model_chunks)):
        chunk.load_state_dict(loaded[f"model{index}"], strict=False)
    with torch.no_grad():  # fp32 runs: the optimizer's main params are views of the model's
        worker.optimizer.load_state_dict(loaded["optimizer"])
    _restore_torch_adam_steps(worker.optimizer)
    extra = torch.load(path / "scheduler.pt", weights_only=False)
    worker.scheduler.load_state_dict(extra["scheduler"])
    worker.steps_done = extra["steps_done"]


def _create_optimizer_state(optimizer: Any) -> None:
    """Give a never-stepped distributed optimizer its state tensors before a load.

    Without Apex/TE, ``DistributedOptimizer.state_dict`` (called while building the sharded
    state to load into) needs a ``step`` in every param state; megatron creates the dummy
    state only later in that call. Its own helper runs one zero-gradient inner step; the
    loaded values then replace everything in place.
    """
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        create = getattr(inner, "_init_optimizer_states_with_dummy_values", None)
        if create is not None and not inner.optimizer.state:
            create()


def _restore_torch_adam_steps(optimizer: Any) -> None:
    """Per-parameter Adam ``step`` from the loaded param groups.

    Without Apex/TE, megatron-core 0.16 restores exp_avg/exp_avg_sq exactly but leaves torch
    Adam's per-parameter ``step`` at the dummy state's 1 (the loaded count sits in the param
    groups), so Adam's bias correction after a resume would differ from the saved run.
    """
    import torch

    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for group in torch_optimizer.param_groups:
            if group.get("step") is None:
                continue
            for param in group["params"]:
                state = torch_optimizer.state.get(param)
                if state and isinstance(state.get("step"), torch.Tensor):
                    state["step"] = torch.full_like(state["step"], float(group["step"]))
