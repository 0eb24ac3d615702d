"""A Megatron training checkpoint (torch_dist, any TP/PP) as a Hugging Face folder.

The model is built once more at TP=PP=CP=EP=1 from the run's HF checkpoint (provider with the
recipe's precision, ``model_overrides`` and ``hf_config_overrides``, as training built it), without random init;
dist_checkpointing reshards the checkpoint's model tensors into it (the optimizer's are left
on disk), and megatron-bridge writes the HF folder as the in-job export does
(``MegatronWorker.export_hf``). It runs in a spawned process with a one-rank gloo group and,
on the CPU, hpcrl's CPU compatibility layer, so it never touches the caller's process groups
and a crash cannot leave them wedged.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs

from hpcrl.run.export_progress import ExportProgress

if TYPE_CHECKING:
    from hpcrl.config.recipe import MegatronCfg, Recipe

#: The training checkpoint's torch_dist folder inside a step folder (checkpoint.py).
MEGATRON_SUBDIR = "megatron"


def single_rank_cfg(cfg: MegatronCfg) -> MegatronCfg:
    """``cfg`` laid out on one rank: what the export process builds."""
    # Any: the schema's ``frozen`` alias hides the attrs class from mypy's plugin.
    evolved: Any = attrs.evolve(
        cast(Any, cfg),
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        expert_model_parallel_size=1,
        expert_tensor_parallel_size=1,
        num_layers_in_first_pipeline_stage=None,
        num_layers_in_last_pipeline_stage=None,
        sequence_parallel=False,
        cpu_offloading=False,
        fine_grained_activation_offloading=False,
        offload_modules=(),
        cuda_graph_impl="none",
    )
    return cast("MegatronCfg", evolved)


def export_in_subprocess(
    recipe: Recipe,
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    model_path: str,
    say: ExportProgress | None = None,
) -> None:
    """``export_torch_dist_to_hf`` in a spawned child (one gloo rank, CPU layer)."""
    child = multiprocessing.get_context("spawn").Process(
        target=_export_child,
        args=(recipe, str(checkpoint_dir), str(out_dir), model_path, say),
        name="hpcrl-megatron-export",
    )
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(
            f"exporting the Megatron checkpoint {checkpoint_dir} failed (exit code "
            f"{child.exitcode}); its output is above"
        )


def _export_child(
    recipe: Recipe, checkpoint_dir: str, out_dir: str, model_path: str, say: ExportProgress | None
) -> None:
    import torch.distributed as dist

    from hpcrl.core.backends.megatron.cpu_compat import apply_for_process

    apply_for_process()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        export_torch_dist_to_hf(recipe, checkpoint_dir, out_dir, model_path, say)
    finally:
        from megatron.core import parallel_state

        from hpcrl.core.backends.megatron.checkpoint import release_writer_results_queue

        parallel_state.destroy_model_parallel()
        release_writer_results_queue()
        dist.destroy_process_group()
    # gloo threads can abort the interpreter at exit (training-stack-facts.md); all is on disk.
    os._exit(0)


def export_torch_dist_to_hf(
    recipe: Recipe,
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    model_path: str,
    say: ExportProgress | None = None,
) -> None:
    """In a process whose default group has one rank (and, on CPU, the CPU layer applied)."""
    from hpcrl.core.backends.megatron.bridge_compat import save_hf_pretrained
    from hpcrl.core.backends.megatron.generation import build_bridge
    from hpcrl.core.backends.megatron.model import initialize_parallel_state

    cfg = single_rank_cfg(recipe.policy.megatron_cfg)
    initialize_parallel_state(cfg, seed=0)
    say = say or ExportProgress(quiet=True)
    say(f"building the model of {model_path} on one rank (TP=PP=1)")
    chunks = build_model_without_init(recipe, cfg, model_path)
    say(f"loading the checkpoint's model tensors from {Path(checkpoint_dir) / MEGATRON_SUBDIR}")
    load_model_weights(chunks, Path(checkpoint_dir) / MEGATRON_SUBDIR)
    say(f"writing the Hugging Face folder {out_dir} (megatron-bridge)")
    bridge = build_bridge(model_path, recipe.policy.hf_config_overrides)
    save_hf_pretrained(bridge, chunks, str(out_dir))


def build_model_without_init(recipe: Recipe, cfg: MegatronCfg, model_path: str) -> list:
    """Unwrapped model chunks on the CPU, built as training built them (same provider
    settings), with no random init: every weight is loaded next."""
    from hpcrl.core.backends.megatron.hf_import import build_provider
    from hpcrl.core.backends.megatron.provider import prepare_provider

    policy = recipe.policy
    # With LoRA the checkpoint holds the adapters alone: the base weights are the HF model's
    lora = cfg.peft.enabled
    provider = build_provider(
        model_path, load_weights=lora, hf_config_overrides=policy.hf_config_overrides
    )
    prepare_provider(provider, cfg, policy.precision, policy.max_total_sequence_length)
    provider.perform_initialization = False
    provider.finalize()
    if lora:
        from hpcrl.core.backends.megatron.lora import lora_pre_wrap_hook

        provider.register_pre_wrap_hook(lora_pre_wrap_hook(cfg.peft))
    return provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True, data_parallel_random_init=False
    )


def load_model_weights(model_chunks: list, megatron_dir: Path) -> None:
    """The model part of a training checkpoint (``checkpoint.save_training_state``) into
    ``model_chunks``; its keys are layout-free, so any saved TP/PP loads at TP=PP=1."""
    from megatron.core import dist_checkpointing
    from megatron.core.utils import unwrap_model

    if not megatron_dir.is_dir():
        raise FileNotFoundError(
            f"{megatron_dir} is missing: not a checkpoint of hpcrl's Megatron backend (an "
            "Automodel run's checkpoint holds dcp/ instead)"
        )
    from hpcrl.core.backends.megatron.lora import adapters_only, is_adapter_key

    for index, chunk in enumerate(unwrap_model(model_chunks)):
        state = chunk.sharded_state_dict()
        adapted = any(is_adapter_key(key) for key in state)
        wanted: dict[str, Any] = {f"model{index}": adapters_only(state) if adapted else state}
        loaded = dist_checkpointing.load(wanted, str(megatron_dir))
        missing, unexpected = chunk.load_state_dict(loaded[f"model{index}"], strict=False)
        # a LoRA model's base weights came from the HF checkpoint, not from this one
        missing = [
            key
            for key in missing
            if not key.endswith("_extra_state") and not (adapted and not is_adapter_key(key))
        ]
        if missing or unexpected:
            raise ValueError(
                f"{megatron_dir} does not fit the model built from the run's recipe: missing "
                f"{missing[:5]}, unexpected {unexpected[:5]}"
            )
