"""Benchmark: the Automodel reference model's first pass (build + one log-prob pass) from the
checkpoint on disk against from the policy's weights in memory, in one process (CPU, or
one GPU with ``--device cuda``).

For each model (``tiny:qwen2``, and a ~100M-parameter Llama-shaped random model written to a
temporary folder) one real ``AutomodelWorker`` (1 gloo rank) is set up and runs the policy's
log-prob pass; then the reference is built and run ``--repeats`` times per path, the paths
alternating (the page cache holds the checkpoint for both: the disk figure is a warm read).
Printed: the median seconds per path and the ratio, as one JSON line per model.

    python benchmarks/reference_build.py --repeats 3
    python benchmarks/reference_build.py --repeats 3 --device cuda    # one GPU
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist


def _write_100m_model(folder: str) -> str:
    """A random Llama-shaped model of ~106M parameters (hidden 768, 8 layers, vocab 32000,
    untied), fp32 safetensors."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
        num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


def _worker(model_path: str, port: int, device: str) -> Any:
    import attrs

    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from tests.recipe_builder import tiny_automodel_recipe

    recipe = tiny_automodel_recipe()
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, model_name=model_path))
    info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                    master_addr="127.0.0.1", master_port=port, device=device)  # fmt: skip
    worker = AutomodelWorker()
    worker.setup(recipe, info, model_path)
    return worker


def _first_reference_pass_s(worker: Any, batch: dict, from_memory: bool) -> float:
    worker.reference = None
    worker.policy_weights_initial = from_memory  # the checkpoint path otherwise
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    worker.reference_logprobs(batch)  # its read-back to the host waits for the device
    elapsed = time.perf_counter() - started
    assert worker.reference_source == ("policy" if from_memory else "checkpoint")
    return elapsed


def measure(name: str, model_path: str, port: int, repeats: int, device: str) -> dict[str, Any]:
    from tests.core.parallel_harness import make_batch

    worker = _worker(model_path, port, device)
    params = sum(p.numel() for p in worker.model.parameters())
    batch = make_batch(0, batch_size=4, seq_len=64)
    worker.logprobs(batch)
    seconds: dict[str, list[float]] = {"disk": [], "memory": []}
    for _ in range(repeats):
        seconds["disk"].append(_first_reference_pass_s(worker, batch, from_memory=False))
        seconds["memory"].append(_first_reference_pass_s(worker, batch, from_memory=True))
    worker.close()
    disk, memory = (statistics.median(seconds[key]) for key in ("disk", "memory"))
    return {"model": name, "params_m": round(params / 1e6, 1), "disk_s": round(disk, 3),
            "memory_s": round(memory, 3), "disk_over_memory": round(disk / memory, 2),
            "all_s": {k: [round(v, 3) for v in vs] for k, vs in seconds.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    from hpcrl.core.models.tiny import ensure_tiny_model

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as folder:
        models = {
            "tiny:qwen2": ensure_tiny_model("tiny:qwen2", cache_dir=folder),
            "llama-100m": _write_100m_model(f"{folder}/llama-100m"),
        }
        for name, path in models.items():
            print(json.dumps(measure(name, path, port, args.repeats, args.device)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
