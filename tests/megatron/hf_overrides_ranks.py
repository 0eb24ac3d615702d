"""Rank function of the ``policy.hf_config_overrides`` parity test: the Megatron model built
as the worker builds it (``build_provider`` → ``prepare_provider`` → ``finalize``, HF weights
loaded by the bridge), once per set of overrides, scoring the same tokens. Lives outside the
test module so that the spawned rank imports it by a stable path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(token t+1 | tokens ..t) for every position but the last, float64 for the diff."""
    logprobs = torch.log_softmax(logits.double(), dim=-1)[:, :-1]
    return logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def megatron_logprobs(
    rank: int,
    world_size: int,
    hf_path: str,
    variants: dict[str, dict[str, Any]],
    input_ids: torch.Tensor,
    export_dir: str,
) -> dict[str, Any]:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from hpcrl.config.recipe import MegatronCfg
    from hpcrl.core.backends.megatron.bridge_compat import save_hf_pretrained
    from hpcrl.core.backends.megatron.generation import build_bridge
    from hpcrl.core.backends.megatron.hf_import import build_provider
    from hpcrl.core.backends.megatron.provider import prepare_provider

    parallel_state.initialize_model_parallel(1, 1)
    out: dict[str, Any] = {"logprobs": {}, "rope": {}}
    for name, overrides in variants.items():
        model_parallel_cuda_manual_seed(0)
        provider = build_provider(hf_path, load_weights=True, hf_config_overrides=overrides)
        prepare_provider(provider, MegatronCfg(enabled=True), "float32", input_ids.shape[1])
        provider.finalize()
        (model,) = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, mixed_precision_wrapper=None
        )
        model.eval()
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        with torch.no_grad():
            logits = model(input_ids, positions, attention_mask=None)
        out["logprobs"][name] = token_logprobs(logits, input_ids)
        out["rope"][name] = type(model.rotary_pos_emb).__name__
        if name == "nemo_rl_yarn":
            # the export writes the config the run trained (what a later job loads)
            save_hf_pretrained(build_bridge(hf_path, overrides), [model], export_dir)
    return out


def worker_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, overrides: dict[str, Any]
) -> dict[str, Any]:
    """The real MegatronWorker set up with ``policy.hf_config_overrides``: its conversion
    directory, its model's RoPE, its log-probs of a fixed batch and its refit export."""
    import attrs

    from tests.megatron import harness
    from tests.recipe_builder import tiny_megatron_recipe

    recipe = tiny_megatron_recipe(hf_path)
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, hf_config_overrides=overrides))
    worker, place = harness.setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    batch = harness.fixed_batch()
    (chunk,) = worker.model_chunks
    return {
        "conversions": sorted(path.name for path in Path(ckpt_root).iterdir()),
        "rope": type(chunk.module.rotary_pos_emb).__name__,
        "logprobs": worker.logprobs(batch),
        "input_ids": batch["input_ids"],
        "exported": sorted(name for name, _ in worker.export_hf_weights()),
    }
