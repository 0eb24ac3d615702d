"""Benchmark: what ``policy.megatron_cfg.manual_gc`` is for — step-time spikes of 2 ranks.

Two gloo ranks (spawned processes) each run hpcrl's real ``TrainingWorker`` on the tiny Qwen2
model (FSDP2 over the two ranks, so every step ends in collectives that make one rank wait for
the other). Each step also leaves what a training loop leaves behind: cyclic garbage (objects
only the cycle collector frees) and retained small objects (log records, metrics dicts), which
grow the oldest generation until Python runs a full collection. With torch and transformers
loaded a full collection walks ~350k objects (~0.2 s here), at a different step on each rank,
and the other rank waits for it in the next collective.

Modes (each in its own pair of processes, alternating order, ``--repeats`` times):
- ``auto``: Python's automatic GC, as without the setting.
- ``manual``: ``manual_gc: true, manual_gc_interval: N`` — hpcrl's ``ManualGc`` freezes what
  setup allocated, switches automatic GC off and collects on every rank at steps N, 2N, ...

Printed per mode (rank 0's step times, which include waiting for rank 1): median, p99 and max
step, steps slower than 3× the median, and the full (generation-2) collections per rank.

    .venv/bin/python benchmarks/manual_gc.py                    # 400 steps, interval 100
    .venv/bin/python benchmarks/manual_gc.py --steps 60 --repeats 1 --interval 20   # smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

SLOW_FACTOR = 3.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--interval", type=int, default=100, help="manual_gc_interval")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode")
    parser.add_argument("--cycles-per-step", type=int, default=500, help="cyclic garbage")
    parser.add_argument("--retained-per-step", type=int, default=2000, help="kept dicts")
    return parser.parse_args(argv)


def make_recipe(model_path: str, manual_interval: int):
    from hpcrl.config.recipe import (
        AutomodelCfg,
        DataCfg,
        MegatronCfg,
        OptimizerCfg,
        PolicyCfg,
        Recipe,
        SftCfg,
    )

    return Recipe(
        policy=PolicyCfg(
            model_name=model_path,
            train_global_batch_size=8,
            train_micro_batch_size=4,
            precision="float32",
            max_grad_norm=1.0,
            optimizer=OptimizerCfg(name="adamw", lr=1e-4),
            automodel_cfg=AutomodelCfg(enabled=True),
            megatron_cfg=MegatronCfg(
                manual_gc=manual_interval > 0, manual_gc_interval=manual_interval
            ),
        ),
        data=DataCfg(train_path="unused.jsonl"),
        sft=SftCfg(max_num_steps=1_000_000),
    )


def leave_garbage(cycles: int, retained: int, log: list) -> None:
    """What one training step leaves: reference cycles (garbage) and records kept in a log."""
    for index in range(cycles):
        node = {"index": index}
        node["self"] = node
    log.extend({"step": index, "loss": 0.0, "tags": ["a", "b"]} for index in range(retained))


def nll(logprobs, batch, num_global_tokens):
    return -(logprobs * batch["token_mask"]).sum() / num_global_tokens, {}


def rank_main(rank: int, args: argparse.Namespace, mode: str, model_path: str, port: int,
              out_dir: str) -> None:  # fmt: skip
    import torch

    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.backends.base import RankInfo
    from hpcrl.core.workers.actor import TrainingWorker
    from hpcrl.core.workers.group import worker_env
    from tests.core.parallel_harness import make_batch

    worker = TrainingWorker(worker_class_path("automodel"), worker_env("cpu"))
    rank_info = RankInfo(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                         node_rank=0, master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
    interval = args.interval if mode == "manual" else 0
    worker.setup(make_recipe(model_path, interval), rank_info, model_path, 1)
    batch = make_batch(seed=0, batch_size=8)
    shard = {key: value[rank * 4 : (rank + 1) * 4] for key, value in batch.items()}
    num_tokens = float(batch["token_mask"].sum())
    full_collections = []
    gc.callbacks.append(
        lambda phase, info: (
            full_collections.append(phase) if phase == "start" and info["generation"] == 2 else None
        )
    )
    log: list = []
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        worker.train(shard, nll, num_tokens, 4)
        leave_garbage(args.cycles_per_step, args.retained_per_step, log)
        times.append(time.perf_counter() - started)
    result = {"times": times, "full_collections": len(full_collections),
              "torch_threads": torch.get_num_threads()}  # fmt: skip
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    worker.close()
    os._exit(0)  # gloo threads can abort the interpreter at exit


def run_mode(args: argparse.Namespace, mode: str, model_path: str) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="hpcrl-gc-") as out_dir:
        mp.start_processes(rank_main, args=(args, mode, model_path, port, out_dir), nprocs=2,
                           start_method="spawn")  # fmt: skip
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(2)]
    return {"times": ranks[0]["times"], "full_collections": [r["full_collections"] for r in ranks]}


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    median = statistics.median(ordered)
    return {
        "median_ms": median * 1e3,
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))] * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "slow_steps": sum(t > SLOW_FACTOR * median for t in ordered),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from hpcrl.core.models.tiny import ensure_tiny_model

    model_path = ensure_tiny_model("tiny:qwen2", cache_dir=tempfile.mkdtemp(prefix="hpcrl-gc-m-"))
    runs: dict[str, list[dict]] = {"auto": [], "manual": []}
    for repeat in range(args.repeats):
        for mode in ("auto", "manual") if repeat % 2 == 0 else ("manual", "auto"):
            result = run_mode(args, mode, model_path)
            stats = summary(result["times"])
            runs[mode].append({**stats, "full_collections": result["full_collections"]})
            print(f"run {repeat} {mode:6s} median {stats['median_ms']:6.1f} ms  max "
                  f"{stats['max_ms']:6.1f} ms  full GCs per rank {result['full_collections']}  "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    print(f"\n{args.steps} steps, 2 ranks, {args.cycles_per_step} cycles + "
          f"{args.retained_per_step} kept dicts per step; manual_gc_interval={args.interval}")  # fmt: skip
    print(f"{'mode':<8} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} {'>3x median':>11} "
          f"{'full GCs/rank':>14}")  # fmt: skip
    for mode, results in runs.items():
        for r in results:
            print(f"{mode:<8} {r['median_ms']:>10.1f} {r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} "
                  f"{r['slow_steps']:>11d} {str(r['full_collections']):>14}")  # fmt: skip
    auto_max = statistics.median(r["max_ms"] for r in runs["auto"])
    manual_max = statistics.median(r["max_ms"] for r in runs["manual"])
    print(f"max step auto / manual: {auto_max / manual_max:.2f}x (medians over runs)")


if __name__ == "__main__":
    main()
