"""HF checkpoint → Megatron (torch_dist) through megatron-bridge, and loading it back.

The conversion runs in a fresh spawned process with a one-rank gloo group and TP=PP=1, apart
from the job's process groups and devices: the job's ranks keep their own parallel state,
and a crash or kill of the converter cannot wedge them. dist_checkpointing reshards the TP=1
result to any TP/PP at load.

A conversion directory holds ``weights/`` (dist_checkpointing, torch_dist) and
``run_config.yaml`` (the finalized provider, ``model_overrides`` included).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcrl.core.backends.megatron.bridge_compat import import_bridge
from hpcrl.core.backends.megatron.conversion import Converter, Progress, print_progress
from hpcrl.core.backends.megatron.provider import (
    apply_model_overrides,
    transformer_engine_available,
    use_local_spec,
)

WEIGHTS_SUBDIR = "weights"
RUN_CONFIG_FILE = "run_config.yaml"


def make_converter(
    model_overrides: Mapping[str, Any],
    prepare: Callable[[], None] | None = None,
    heartbeat_s: float = 30.0,
    hf_config_overrides: Mapping[str, Any] | None = None,
) -> Converter:
    """The converter ``ensure_megatron_checkpoint`` calls. ``prepare`` runs first in the
    child: a CPU job's worker passes the CPU compatibility layer
    (``cpu_compat.apply_for_process``), a GPU job None. ``hf_config_overrides``: the
    recipe's ``policy.hf_config_overrides`` (the provider is built from the changed config)."""
    return functools.partial(
        convert_in_subprocess,
        model_overrides=dict(model_overrides),
        prepare=prepare,
        heartbeat_s=heartbeat_s,
        hf_config_overrides=dict(hf_config_overrides or {}),
    )


def convert_in_subprocess(
    hf_path: str,
    out_dir: str,
    *,
    model_overrides: Mapping[str, Any],
    prepare: Callable[[], None] | None,
    heartbeat_s: float,
    progress: Progress = print_progress,
    hf_config_overrides: Mapping[str, Any] | None = None,
) -> None:
    child = multiprocessing.get_context("spawn").Process(
        target=_convert_child,
        args=(hf_path, out_dir, dict(model_overrides), prepare, dict(hf_config_overrides or {})),
        name="hpcrl-megatron-convert",
    )
    started = time.monotonic()
    child.start()
    while child.is_alive():
        child.join(heartbeat_s)
        if child.is_alive():
            progress(f"still converting ({time.monotonic() - started:.0f} s, pid {child.pid})")
    if child.exitcode != 0:
        raise RuntimeError(
            f"HF → Megatron conversion of {hf_path} failed (converter exit code {child.exitcode}); "
            "its output is above"
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _convert_child(
    hf_path: str, out_dir: str, overrides: dict, prepare: Callable | None, hf_overrides: dict
) -> None:
    started = time.monotonic()

    def stage(message: str) -> None:
        print_progress(f"{message} (t={time.monotonic() - started:.1f} s)")

    if prepare is not None:
        prepare()
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        stage(f"reading HF checkpoint {hf_path}")
        provider = build_provider(hf_path, load_weights=True, hf_config_overrides=hf_overrides)
        apply_model_overrides(provider, overrides)
        provider.finalize()
        stage("building the Megatron model and copying weights (TP=1, PP=1, CPU)")
        model = build_unwrapped_model(provider)
        stage("saving torch_dist checkpoint")
        save_weights(model, Path(out_dir) / WEIGHTS_SUBDIR)
        save_run_config(provider, Path(out_dir) / RUN_CONFIG_FILE)
        stage("conversion written")
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    # Leftover gloo/checkpoint threads can hold a finished child for ~10 s or abort it at
    # interpreter exit; everything is on disk, so leave at once.
    os._exit(0)


def build_provider(
    hf_path: str, load_weights: bool, hf_config_overrides: Mapping[str, Any] | None = None
) -> Any:
    """A fresh provider from the HF config with ``policy.hf_config_overrides`` applied (local
    layer spec when TE is absent; YaRN as Hugging Face reads it: ``hf_overrides.py``)."""
    from hpcrl.core.backends.megatron.hf_overrides import bridge_with_overrides, complete_yarn

    bridge = bridge_with_overrides(hf_path, hf_config_overrides or {})
    provider = bridge.to_megatron_provider(load_weights=load_weights)
    complete_yarn(provider, bridge.hf_pretrained.config)
    # hpcrl runs no multi-token prediction (policy.megatron_cfg.mtp_num_layers is accepted
    # at 0 or null only, as NeMo RL's recipes set it: MTP off). megatron-bridge copies an HF
    # config's num_nextn_predict_layers (GLM-4.5, MiMo) into mtp_num_layers, whose MTP layers
    # megatron-core 0.16 runs only with labels in the forward; None is its "off" (0 still
    # enters its MTP loss code). The HF checkpoint's MTP weights are then not read.
    if getattr(provider, "mtp_num_layers", None) is not None:
        provider.mtp_num_layers = None
    if not transformer_engine_available():
        use_local_spec(provider)
    return provider


def build_unwrapped_model(provider: Any) -> Any:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    chunks = provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True, mixed_precision_wrapper=None
    )
    assert len(chunks) == 1
    return chunks[0]


def save_weights(model: Any, weights_dir: Path) -> None:
    from megatron.core import dist_checkpointing

    from hpcrl.core.backends.megatron.checkpoint import release_writer_results_queue

    weights_dir.mkdir(parents=True)
    dist_checkpointing.save(model.sharded_state_dict(), str(weights_dir))
    release_writer_results_queue()


def save_run_config(provider: Any, path: Path) -> None:
    """Persist the finalized provider (overrides included) field by field."""
    import dataclasses

    import_bridge()
    from megatron.bridge.utils.yaml_utils import dump_dataclass_to_yaml

    cls = type(provider)
    fields = {
        f.name: getattr(provider, f.name)
        for f in dataclasses.fields(provider)
        if not f.name.startswith("_")
    }
    path.write_text(
        dump_dataclass_to_yaml(
            {"model": {"_target_": f"{cls.__module__}.{cls.__qualname__}", **fields}}
        )
    )


def load_weights(model_chunks: list, weights_dir: Path) -> None:
    """Load a conversion's weights into (possibly DDP/Float16-wrapped) model chunks at any TP/PP."""
    from megatron.core import dist_checkpointing
    from megatron.core.utils import unwrap_model

    from hpcrl.core.backends.megatron.lora import is_adapter_key, to_module_names, without_adapters

    for chunk in unwrap_model(model_chunks):
        # LoRA adapters are not in a conversion: they keep their initial values
        sharded = without_adapters(chunk.sharded_state_dict())
        loaded = dist_checkpointing.load(sharded, str(weights_dir))
        missing, unexpected = chunk.load_state_dict(to_module_names(loaded, chunk), strict=False)
        missing = [
            key for key in missing if not key.endswith("_extra_state") and not is_adapter_key(key)
        ]
        assert not missing and not unexpected, (
            f"weights mismatch: missing {missing}, unexpected {unexpected}"
        )


def read_run_config(conversion_dir: Path) -> dict:
    """The persisted provider fields of a conversion (values as written: plain YAML)."""
    import yaml

    return yaml.safe_load((conversion_dir / RUN_CONFIG_FILE).read_text())["model"]
