"""Training checkpoints of the Megatron backend (model + optimizer + scheduler + step).

torch_dist through megatron-core's dist_checkpointing: model weights reshard to any layout.
The distributed optimizer's state is saved in ``checkpoint.optimizer_format``:

- ``dp_reshardable`` (default): its buffers as they are, fully parallel, no gathers; a resume
  may change DP only (tested from DP 2 to DP 4);
- ``fully_reshardable``: gathered over DP into one tensor per parameter and state (model
  space) at save; a resume may change TP, PP and DP (tested from TP 1 x DP 2 to TP 2 and to
  TP 2 x PP 2).

The format and the layout are saved beside the state; a load builds its sharded state in the
saved format, and a ``dp_reshardable`` checkpoint loaded at another TP or PP fails first with
both layouts and what to do, instead of megatron-core's shape mismatch deep in the load.
(megatron-core's third format, ``fully_sharded_model_space``, cannot save in 0.16 nor 0.19:
"ShardedTensor.flattened_range is not supported".) Loads read with
``checkpoint.parallel_read_threads`` threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DP_RESHARDABLE = "dp_reshardable"
FULLY_RESHARDABLE = "fully_reshardable"
# Not a megatron format name: what a run without the distributed optimizer records (its
# state is saved per parameter, like the model's, and reshards with it).
PER_PARAMETER = "per_parameter"
LAYOUT_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size")


def optimizer_format(worker: Any) -> str:
    """The optimizer-state format this worker saves in."""
    if not worker.cfg.optimizer.use_distributed_optimizer:
        return PER_PARAMETER
    return str(worker.cfg.checkpoint.optimizer_format)


def _sharded_state(worker: Any, is_loading: bool, state_format: str) -> dict:
    from megatron.core.utils import unwrap_model

    from hpcrl.core.backends.megatron.lora import adapters_only

    model_state = {}
    for index, chunk in enumerate(unwrap_model(worker.model_chunks)):
        state = chunk.sharded_state_dict()
        # With LoRA the base weights stay those of the conversion: the adapters alone are saved
        model_state[f"model{index}"] = adapters_only(state) if worker.cfg.peft.enabled else state
    # The distributed optimizer reads the format from here; the others ignore it.
    format_name = DP_RESHARDABLE if state_format == PER_PARAMETER else state_format
    optimizer_state = worker.optimizer.sharded_state_dict(
        model_state, is_loading=is_loading, metadata={"distrib_optim_sharding_type": format_name}
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
    state_format = optimizer_format(worker)
    dist_checkpointing.save(_sharded_state(worker, False, state_format), str(path))
    if dist.get_rank() == 0:
        torch.save(
            {
                "scheduler": worker.scheduler.state_dict(),
                "steps_done": worker.steps_done,
                "layout": model_parallel_layout(),
                "optimizer_format": state_format,
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
    """A dp_reshardable checkpoint loaded at another TP/PP (its optimizer state cannot reshard)."""


def check_layout(
    saved: dict[str, int] | None,
    current: dict[str, int],
    checkpoint_dir: str,
    state_format: str = DP_RESHARDABLE,
) -> None:
    """Raise when a dp_reshardable checkpoint meets another TP or PP (DP may change; the
    other formats reshard on every axis); checkpoints without a saved layout pass."""
    if state_format != DP_RESHARDABLE or saved is None:
        return
    if all(saved[key] == current[key] for key in LAYOUT_KEYS):
        return
    saved_text = ", ".join(f"policy.megatron_cfg.{key}={saved[key]}" for key in LAYOUT_KEYS)
    current_text = ", ".join(f"{key}={current[key]}" for key in LAYOUT_KEYS)
    raise CheckpointLayoutMismatch(
        f"{checkpoint_dir} was saved with {saved_text}; this run has {current_text}. Its "
        "distributed optimizer state is dp_reshardable: it reloads at any data-parallel size "
        "but only at the same TP and PP. Resume with the saved TP and PP (change the number "
        "of nodes or GPUs to change DP); to change TP/PP, save from the old layout with "
        "policy.megatron_cfg.checkpoint.optimizer_format=fully_reshardable, or start a new "
        "run from the model weights (export_hf) at the new layout."
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
    # Saved before the format was recorded: dp_reshardable, the only format then.
    state_format = extra.get("optimizer_format", DP_RESHARDABLE)
    check_layout(extra.get("layout"), model_parallel_layout(), checkpoint_dir, state_format)
    check_optimizer_kind(state_format, optimizer_format(worker), checkpoint_dir)
    _create_optimizer_state(worker.optimizer)
    with parallel_reads(worker.cfg.checkpoint.parallel_read_threads):
        loaded = dist_checkpointing.load(_sharded_state(worker, True, state_format), str(path))
    for index, chunk in enumerate(unwrap_model(worker.model_chunks)):
        chunk.load_state_dict(loaded[f"model{index}"], strict=False)
    # fp32 runs: the optimizer's main params are views of the model's (hence no_grad).
    with torch.no_grad(), _torch_adam_steps_set_aside(worker.optimizer, state_format):
        worker.optimizer.load_state_dict(loaded["optimizer"])
    _restore_torch_adam_steps(worker.optimizer)
    worker.scheduler.load_state_dict(extra["scheduler"])
    worker.steps_done = extra["steps_done"]


def check_optimizer_kind(saved_format: str, current_format: str, checkpoint_dir: str) -> None:
    """The distributed optimizer and the plain one save different state structures."""
    if (saved_format == PER_PARAMETER) == (current_format == PER_PARAMETER):
        return
    saved = "without" if saved_format == PER_PARAMETER else "with"
    raise CheckpointLayoutMismatch(
        f"{checkpoint_dir} was saved {saved} the distributed optimizer; this run has "
        f"policy.megatron_cfg.optimizer.use_distributed_optimizer="
        f"{str(saved_format == PER_PARAMETER).lower()}. Resume with the saved setting."
    )


@contextmanager
def _torch_adam_steps_set_aside(optimizer: Any, state_format: str) -> Iterator[None]:
    """Take torch Adam's per-parameter ``step`` out of the way of a fully_reshardable load.

    Without Apex/TE the distributed optimizer runs torch's Adam, whose state holds a ``step``
    tensor per parameter; ``fully_reshardable`` does not save it (the count is in the param
    groups), yet megatron-core's loader (0.16 and 0.19, ``_set_main_param_and_optimizer_states``)
    copies into every tensor of the state and fails with ``KeyError: 'step'``. A post-hook of
    torch's own ``load_state_dict`` (which megatron calls just before that copy) sets the step
    tensors aside; they go back afterwards, and ``_restore_torch_adam_steps`` gives them the
    loaded count. With Apex/TE (no per-parameter step) this sets nothing aside.
    """
    if state_format != FULLY_RESHARDABLE:
        yield
        return
    aside: list[tuple[dict, Any]] = []

    def set_aside(torch_optimizer: Any) -> None:
        for state in torch_optimizer.state.values():
            if "step" in state:
                aside.append((state, state.pop("step")))

    handles = [
        inner.optimizer.register_load_state_dict_post_hook(set_aside)
        for inner in getattr(optimizer, "chained_optimizers", [optimizer])
        if hasattr(getattr(inner, "optimizer", None), "register_load_state_dict_post_hook")
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for state, step_tensor in aside:
            state.setdefault("step", step_tensor)


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
