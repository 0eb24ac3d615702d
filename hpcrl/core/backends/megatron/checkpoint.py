"""Training checkpoints of the Megatron backend (model + optimizer + scheduler + step).

torch_dist through megatron-core's dist_checkpointing: model weights reshard to any layout;
the distributed optimizer's state is saved ``dp_reshardable`` (its buffers as they are, fully
parallel), so a resume keeps TP/PP (DP may change: tested from DP 2 to DP 4). The layout is
saved beside the state, and a load at another TP or PP fails first with both layouts and what
to do, instead of megatron-core's shape mismatch deep in the load. Loads read with
``checkpoint.parallel_read_threads`` threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Optimizer buffers as they are (fully parallel, no gathers); reload needs the same TP/PP.
# ("fully_reshardable" fails on load without Apex/TE: torch Adam keeps a per-param
# "step" that format does not save; "fully_sharded_model_space" fails on save: "ShardedTensor.
# flattened_range is not supported" — megatron-core 0.16.)
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
            {
                "scheduler": worker.scheduler.state_dict(),
                "steps_done": worker.steps_done,
                "layout": model_parallel_layout(),
            },
            path / "scheduler.pt",
        )
    dist.barrier()


def model_parallel_layout() -> dict[str, int]:
    """This run's TP/PP/DP sizes (megatron's parallel state)."""
    from megatron.core import parallel_state

    return {
        "tensor_model_parallel_size": parallel_state.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": parallel_state.get_pipeline_model_parallel_world_size(),
        "data_parallel_size": parallel_state.get_data_parallel_world_size(),
    }


class CheckpointLayoutMismatch(ValueError):
    """A checkpoint saved at one TP/PP loaded at another (its optimizer state cannot reshard)."""


def check_layout(
    saved: dict[str, int] | None, current: dict[str, int], checkpoint_dir: str
) -> None:
    """Raise when TP or PP differ (DP may); checkpoints without a saved layout pass."""
    keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size")
    if saved is None or all(saved[key] == current[key] for key in keys):
        return
    saved_text = ", ".join(f"policy.megatron_cfg.{key}={saved[key]}" for key in keys)
    current_text = ", ".join(f"{key}={current[key]}" for key in keys)
    raise CheckpointLayoutMismatch(
        f"{checkpoint_dir} was saved with {saved_text}; this run has "
        f"{current_text}. The distributed optimizer's state is saved dp_reshardable: it "
        "reloads at any data-parallel size but only at the same TP and PP. Resume with the "
        "saved TP and PP (change the number of nodes or GPUs to change DP), or start a new run "
        "from the model weights (export_hf) at the new layout."
    )


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
    extra = torch.load(path / "scheduler.pt", weights_only=False)
    check_layout(extra.get("layout"), model_parallel_layout(), checkpoint_dir)
    _create_optimizer_state(worker.optimizer)
    with parallel_reads(worker.cfg.checkpoint.parallel_read_threads):
        loaded = dist_checkpointing.load(_sharded_state(worker, is_loading=True), str(path))
    for index, chunk in enumerate(unwrap_model(worker.model_chunks)):
        chunk.load_state_dict(loaded[f"model{index}"], strict=False)
    with torch.no_grad():  # fp32 runs: the optimizer's main params are views of the model's
        worker.optimizer.load_state_dict(loaded["optimizer"])
    _restore_torch_adam_steps(worker.optimizer)
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
