"""What each spawned gloo rank of ``test_reference_from_policy.py`` runs (``tests/megatron/
harness.run_ranks(..., megatron=False)``): the real Automodel worker's reference model built
from the policy's weights in memory, against the checkpoint build, then the cases that must
keep reading the checkpoint (a resumed policy, LoRA)."""

from __future__ import annotations

import os
from typing import Any

import attrs
import torch


def _worker(rank: int, world_size: int, recipe: Any, model_path: str) -> Any:
    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo

    info = RankInfo(rank=rank, world_size=world_size, local_rank=rank,
                    local_world_size=world_size, node_rank=0, master_addr="127.0.0.1",
                    master_port=int(os.environ["MASTER_PORT"]), device="cpu")  # fmt: skip
    worker = AutomodelWorker()
    worker.setup(recipe, info, model_path)
    return worker


def _recipe(model_path: str, **automodel: Any) -> Any:
    from tests.recipe_builder import tiny_automodel_recipe, with_automodel

    recipe = tiny_automodel_recipe(lr=2e-2)
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, model_name=model_path))
    return with_automodel(recipe, **automodel) if automodel else recipe


def _checkpoint_reference_logprobs(worker: Any, batch: dict) -> torch.Tensor:
    """What today's reference (loaded from the checkpoint) gives for ``batch``."""
    reference = worker._build_sharded(worker.model_path, training=False)
    return worker._logprobs_with(
        "reference", reference, batch, worker.distribution.without_filters(), None
    )


def _aliased(worker: Any) -> list[str]:
    """Reference tensors sharing storage with a policy tensor (there must be none)."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    policy = {local(t).untyped_storage().data_ptr() for t in worker.model.state_dict().values()}
    return [name for name, t in worker.reference.state_dict().items()
            if local(t).untyped_storage().data_ptr() in policy]  # fmt: skip


def reference_paths(rank: int, world_size: int, model_path: str, out: str, tp: int) -> dict:
    """In-memory reference vs checkpoint reference, a train step, a resumed worker and a LoRA
    worker: log-probs, which path each reference took, aliasing."""
    from tests.core.parallel_harness import make_batch, masked_nll_loss

    batch = make_batch(seed=3, batch_size=4, seq_len=16)
    worker = _worker(rank, world_size, _recipe(model_path, tensor_parallel_size=tp), model_path)
    initial_policy = worker.logprobs(batch)
    from_policy = worker.reference_logprobs(batch)
    result: dict[str, Any] = {"source": worker.reference_source, "aliased": _aliased(worker)}
    from_checkpoint = _checkpoint_reference_logprobs(worker, batch)
    for _ in range(2):
        worker.train_step([batch], masked_nll_loss, float(batch["token_mask"].sum()))
    result.update(
        initial_policy=initial_policy, from_policy=from_policy, from_checkpoint=from_checkpoint,
        trained_policy=worker.logprobs(batch), reference_after=worker.reference_logprobs(batch),
    )  # fmt: skip
    worker.save_checkpoint(os.path.join(out, f"ckpt_tp{tp}"))
    worker.close()

    resumed = _worker(rank, world_size, _recipe(model_path, tensor_parallel_size=tp), model_path)
    resumed.load_checkpoint(os.path.join(out, f"ckpt_tp{tp}"))
    result["resumed_reference"] = resumed.reference_logprobs(batch)
    result["resumed_source"] = resumed.reference_source
    resumed.close()
    if tp == 1:
        from tests.core.lora_ranks import lora_recipe

        lora = _worker(rank, world_size, lora_recipe(model_path), model_path)
        result["lora_reference"] = lora.reference_logprobs(batch)
        result["lora_source"] = lora.reference_source
        lora.close()
    return result


def _host_state(reference: Any) -> dict:
    """How FSDP holds the reference's weights: offloaded to the host, and all of them back in
    their shards (nothing gathered left over after a pass)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    params = [
        param
        for module in reference.modules()
        if isinstance(module, FSDPModule) and module._get_fsdp_state()._fsdp_param_group
        for param in module._get_fsdp_state()._fsdp_param_group.fsdp_params
    ]
    return {
        "fsdp_params": len(params),
        "offloaded": sum(p.offload_to_cpu for p in params),
        "gathered": sum(p.sharded_state != ShardedState.SHARDED for p in params),
    }


def host_reference_paths(rank: int, world_size: int, model_path: str, out: str, tp: int) -> dict:
    """``reference_on_host``: the reference built from the policy's weights and from the
    checkpoint (a resumed policy), against the checkpoint build of the default reference."""
    from tests.core.parallel_harness import make_batch, masked_nll_loss

    batch = make_batch(seed=3, batch_size=4, seq_len=16)
    default = _worker(rank, world_size, _recipe(model_path, tensor_parallel_size=tp), model_path)
    result: dict[str, Any] = {"from_checkpoint": _checkpoint_reference_logprobs(default, batch)}
    default.close()
    recipe = _recipe(model_path, tensor_parallel_size=tp, reference_on_host=True)
    worker = _worker(rank, world_size, recipe, model_path)
    result["host"] = worker.reference_logprobs(batch)
    result.update(source=worker.reference_source, state=_host_state(worker.reference))
    for _ in range(2):
        worker.train_step([batch], masked_nll_loss, float(batch["token_mask"].sum()))
    result["host_after"] = worker.reference_logprobs(batch)
    worker.save_checkpoint(os.path.join(out, f"host_tp{tp}"))
    worker.close()
    resumed = _worker(rank, world_size, recipe, model_path)
    resumed.load_checkpoint(os.path.join(out, f"host_tp{tp}"))
    result["resumed"] = resumed.reference_logprobs(batch)
    result.update(
        resumed_source=resumed.reference_source, resumed_state=_host_state(resumed.reference)
    )
    resumed.close()
    return result
