"""Rank function of the Megatron export test (spawned ranks import it by module path): train,
save a training checkpoint, return the log-probs before training and at the checkpoint."""

from __future__ import annotations

from tests.megatron.harness import fixed_batch, setup_worker, shard, train_steps
from tests.recipe_builder import tiny_megatron_recipe


def train_and_save_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, tp: int, checkpoint_dir: str
):
    worker, place = setup_worker(
        rank, world_size, tiny_megatron_recipe(hf_path, tp=tp), hf_path, ckpt_root
    )
    batch = shard(fixed_batch(), place)
    initial = worker.logprobs(batch)
    train_steps(worker, place, 3)
    worker.save_checkpoint(checkpoint_dir)
    trained = worker.logprobs(batch)
    worker.close()
    return (initial, trained) if place.returns_results else None
