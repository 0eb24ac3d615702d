"""A real Automodel training checkpoint without Ray: the Automodel worker on one spawned gloo
rank (``tests/megatron/harness.run_ranks(..., megatron=False)``) trains a step and saves. For
tests whose point is what happens to a checkpoint afterwards (the export job on Slurm)."""

from __future__ import annotations

import json
import os


def train_and_save_run(rank: int, world_size: int, model_path: str, checkpoint_dir: str) -> dict:
    """One step of the tiny model, saved as the policy saves (``extra_state.json`` too); the
    trained full weights with Hugging Face names."""
    import attrs

    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from tests.core.parallel_harness import full_weights, make_batch, masked_nll_loss
    from tests.recipe_builder import tiny_automodel_recipe

    recipe = tiny_automodel_recipe(lr=5e-3)
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, model_name=model_path))
    info = RankInfo(rank=rank, world_size=world_size, local_rank=rank,
                    local_world_size=world_size, node_rank=0, master_addr="127.0.0.1",
                    master_port=int(os.environ["MASTER_PORT"]), device="cpu")  # fmt: skip
    worker = AutomodelWorker()
    worker.setup(recipe, info, model_path)
    batch = make_batch(seed=5)
    micro = [{key: value[i : i + 2] for key, value in batch.items()} for i in range(0, 8, 2)]
    worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))
    worker.save_checkpoint(checkpoint_dir)
    with open(os.path.join(checkpoint_dir, "extra_state.json"), "w") as handle:
        json.dump({"step": 1}, handle)
    weights = {name: tensor.clone() for name, tensor in full_weights(worker).items()}
    worker.close()
    return weights
