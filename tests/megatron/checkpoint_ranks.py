"""Rank functions of the Megatron checkpoint tests (spawned ranks import them by module path):
train, save in both optimizer-state formats, go on; fresh workers load and go on the same way."""

from __future__ import annotations

import multiprocessing
import os

import attrs

from tests.megatron.harness import (
    FullCollections,
    fixed_batch,
    setup_worker,
    shard,
    start_training_worker,
    train_steps,
    worker_train,
)
from tests.recipe_builder import tiny_megatron_recipe


def save_in_format(worker, checkpoint_dir: str, optimizer_format: str) -> None:
    """``worker.save_checkpoint`` as a run with ``checkpoint.optimizer_format`` set saves."""
    recipe_cfg = worker.cfg
    worker.cfg = attrs.evolve(
        recipe_cfg,
        checkpoint=attrs.evolve(recipe_cfg.checkpoint, optimizer_format=optimizer_format),
    )
    try:
        worker.save_checkpoint(checkpoint_dir)
    finally:
        worker.cfg = recipe_cfg


def checkpoint_resume_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, train_dir: str, reshardable_dir: str
) -> dict:
    """Train 2 steps, save (``train_dir``: dp_reshardable, the default; ``reshardable_dir``:
    fully_reshardable), train 2 more; then a fresh worker loads ``train_dir`` (parallel reads)
    and trains the same 2 steps: both continuations must agree."""
    worker, place = setup_worker(
        rank, world_size, tiny_megatron_recipe(hf_path), hf_path, ckpt_root
    )
    train_steps(worker, place, 2)
    worker.save_checkpoint(train_dir)
    save_in_format(worker, reshardable_dir, "fully_reshardable")
    continued = train_steps(worker, place, 2)
    worker.close()

    read_in_parallel = tiny_megatron_recipe(hf_path, parallel_read_threads=2)
    resumed_worker, place = setup_worker(rank, world_size, read_in_parallel, hf_path, ckpt_root)
    fresh_loss = train_steps(resumed_worker, place, 1)[0]["loss"]
    resumed_worker.close()
    resumed_worker, place = setup_worker(rank, world_size, read_in_parallel, hf_path, ckpt_root)
    resumed_worker.load_checkpoint(train_dir)
    resumed = train_steps(resumed_worker, place, 2)
    state = dict(resumed_worker.collect_state())
    resumed_worker.close()
    return {
        "helper_processes_left": [child.name for child in multiprocessing.active_children()],
        "continued": continued,
        "resumed": resumed,
        "fresh_first_loss": fresh_loss,
        "state": state,
    }


def load_then_train_run(
    rank: int,
    world_size: int,
    hf_path: str,
    ckpt_root: str,
    train_dir: str,
    layout: dict,
    save_dir: str | None = None,
) -> dict:
    """A fresh worker in ``layout`` loads ``train_dir`` and trains the same 2 steps. With
    ``save_dir`` it then saves a training checkpoint there (the recipe's default format) and
    returns its log-probs of ``fixed_batch`` at that checkpoint (the export test's policy)."""
    recipe = tiny_megatron_recipe(hf_path, **layout)
    worker, place = setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    worker.load_checkpoint(train_dir)
    resumed = train_steps(worker, place, 2)
    state = dict(worker.collect_state())
    saved_logprobs = None
    if save_dir is not None:
        worker.save_checkpoint(save_dir)
        saved_logprobs = worker.logprobs(shard(fixed_batch(), place))
    worker.close()
    return {"resumed": resumed, "state": state, "saved_logprobs": saved_logprobs,
            "place": (place.dp_rank, place.dp_size, place.returns_results)}  # fmt: skip


def training_worker_resume_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, checkpoint_dir: str, port: int
) -> dict:
    """A job's rank (the real ``TrainingWorker`` hosting the backend) trains 2 steps, saves
    and trains 2 more; a fresh one (a new group, on ``port``) loads and trains the same 2,
    its full collections recorded (manual GC every 2 steps)."""
    recipe = tiny_megatron_recipe(hf_path, manual_gc_interval=2)
    worker, place = start_training_worker(
        rank, world_size, recipe, hf_path, ckpt_root, int(os.environ["MASTER_PORT"])
    )
    for _ in range(2):
        worker_train(worker, place)
    worker.save_checkpoint(checkpoint_dir)
    continued = [worker_train(worker, place) for _ in range(2)]
    worker.close()

    worker, place = start_training_worker(rank, world_size, recipe, hf_path, ckpt_root, port)
    worker.load_checkpoint(checkpoint_dir)
    loaded = worker.collect_state()
    resumed = []
    with FullCollections() as collections:
        for collections.step in (3, 4):
            resumed.append(worker_train(worker, place))
    after = worker.collect_state()
    worker.close()
    steps = ("step", "worker_optimizer_steps")
    return {
        "continued": continued,
        "resumed": resumed,
        "loaded_steps": [loaded[key] for key in steps],
        "steps_after": [after[key] for key in steps],
        "peak_memory_gb": after["peak_memory_gb"],
        "resumed_collections": collections.steps,
    }
