"""Rank function of the Megatron LoRA test (spawned ranks import it by module path): the real
MegatronWorker with megatron-bridge's LoRA, trained, refit-exported, saved, exported, resumed."""

from __future__ import annotations

import torch

from hpcrl.config.recipe import MegatronPeftCfg
from tests.megatron.harness import fixed_batch, setup_worker, shard, train_steps
from tests.recipe_builder import tiny_megatron_recipe

LORA = MegatronPeftCfg(enabled=True, dim=4, alpha=8.0)


def lora_recipe(hf_path: str, tp: int):
    return tiny_megatron_recipe(hf_path, tp=tp, lr=2e-2, peft=LORA)


def _named(worker) -> dict[str, torch.Tensor]:
    return {
        f"{index}.{name}": param
        for index, chunk in enumerate(worker.model_chunks)
        for name, param in chunk.named_parameters()
    }


def lora_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, tp: int, checkpoint_dir: str,
    consolidated_dir: str,
) -> dict:  # fmt: skip
    """Train 3 steps with adapters, export for refit, save (and save_consolidated), train 2
    more; a fresh worker loads the checkpoint and trains the same 2 steps."""
    from hpcrl.core.backends.megatron.lora import is_adapter_key

    recipe = lora_recipe(hf_path, tp)
    worker, place = setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    named = _named(worker)
    trainable = sorted(name for name, param in named.items() if param.requires_grad)
    before = {name: param.detach().clone() for name, param in named.items()}
    batch = shard(fixed_batch(), place)
    initial = worker.logprobs(batch)
    trained_steps = train_steps(worker, place, 3)
    changed = [name for name, was in before.items() if not torch.equal(named[name].detach(), was)]
    refit = dict(worker.export_hf_weights())
    trained = worker.logprobs(batch)
    reference = worker.reference_logprobs(batch)
    worker.save_checkpoint(checkpoint_dir)
    worker.export_hf(consolidated_dir)
    continued = train_steps(worker, place, 2)
    worker.close()

    resumed_worker, place = setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    resumed_worker.load_checkpoint(checkpoint_dir)
    resumed_logprobs = resumed_worker.logprobs(batch)
    resumed = train_steps(resumed_worker, place, 2)
    resumed_worker.close()
    reporter = place.returns_results
    return {
        "trainable": trainable,
        "adapters": sorted(name for name in named if is_adapter_key(name)),
        "changed": sorted(changed),
        "trained_steps": trained_steps,
        "continued": continued,
        "resumed": resumed,
        "refit_names": sorted(refit),
        "refit": {name: tensor.clone() for name, tensor in refit.items()} if rank == 0 else None,
        "initial": initial if reporter else None,
        "trained": trained if reporter else None,
        "reference": reference if reporter else None,
        "resumed_logprobs": resumed_logprobs if reporter else None,
    }
