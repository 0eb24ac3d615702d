"""Benchmark: what ``policy.megatron_cfg.manual_gc`` is for — full collections of 2 ranks.

Two gloo ranks (spawned processes) each run hpcrl's real ``TrainingWorker`` on the tiny Qwen2
model (FSDP2 over the two ranks, so every step ends in collectives that make one rank wait for
the other). Each step also leaves what a training loop leaves behind: cyclic garbage (objects
only the cycle collector frees) and retained small objects (log records, metrics dicts), which
grow the oldest generation until Python runs a full collection. With torch and transformers
loaded, an automatic full collection walks the ~350k objects of setup too. When the ranks
allocate alike they collect at the same steps; when they do not (``--retaining-ranks 0``: only
rank 0 keeps records, as a job's logging rank does) each rank's collections stall the other in
the next collective.

Modes (each in its own pair of processes, alternating order, ``--repeats`` times):
- ``auto``: Python's automatic GC, as without the setting.
- ``manual``: ``manual_gc: true, manual_gc_interval: N`` — hpcrl's ``ManualGc`` freezes what
  setup allocated, switches automatic GC off and collects on every rank at steps N, 2N, ...
  (what survives a periodic collection is not frozen: each one walks everything kept since
  setup, so its cost grows with what the loop keeps).

Printed per run (rank 0's step times after ``--warmup`` steps, which include waiting for rank
1): median, p99 and max step, steps slower than 3× the median; the full (generation-2)
collections per rank, whether both ranks ran them at the same steps, and what one costs (CPU
time of the collecting thread, which the machine's other load does not inflate much, and wall
time); the load average. Step times on a loaded machine are mostly scheduling noise: read the
GC columns there.

    .venv/bin/python benchmarks/manual_gc.py                    # 400 steps, interval 100
    .venv/bin/python benchmarks/manual_gc.py --retaining-ranks 0
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
    parser.add_argument(
        "--retaining-ranks", choices=("all", "0"), default="all",
        help="which ranks keep the records: all, or rank 0 only (the logging rank of a real "
        "job: the ranks' allocations then differ, as do their automatic collections)",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the figures")
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
            optimizer=OptimizerCfg(name="torch.optim.AdamW", kwargs={"lr": 1e-4}),
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


class FullCollections:
    """Every full (generation-2) collection of this process: the step it fell in, its wall
    time and its CPU time on the collecting thread (``time.thread_time``: what the collection
    itself costs, whatever else the machine runs)."""

    def __init__(self) -> None:
        self.step = -1
        self.records: list[dict[str, float]] = []
        self._started: tuple[float, float] | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = (time.perf_counter(), time.thread_time())
        elif self._started is not None:
            wall_s, cpu_s = time.perf_counter(), time.thread_time()
            self.records.append({"step": self.step, "wall_ms": (wall_s - self._started[0]) * 1e3,
                                 "cpu_ms": (cpu_s - self._started[1]) * 1e3})  # fmt: skip
            self._started = None


def rank_main(rank: int, args: argparse.Namespace, mode: str, model_path: str, port: int,
              out_dir: str) -> None:  # fmt: skip
    import torch

    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.backends.base import RankInfo
    from hpcrl.core.workers.actor import TrainingWorker
    from hpcrl.core.workers.group import worker_env
    from hpcrl.core.workers.micro_batches import MicroBatchSpec
    from tests.core.parallel_harness import make_batch

    worker = TrainingWorker(worker_class_path("automodel"), worker_env("cpu"))
    rank_info = RankInfo(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                         node_rank=0, master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
    interval = args.interval if mode == "manual" else 0
    worker.setup(make_recipe(model_path, interval), rank_info, model_path, 1)
    batch = make_batch(seed=0, batch_size=8)
    shard = {key: value[rank * 4 : (rank + 1) * 4] for key, value in batch.items()}
    num_tokens = float(batch["token_mask"].sum())
    one_micro_batch = [MicroBatchSpec(rows=(0, 1, 2, 3), width=shard["input_ids"].shape[1])]
    collections = FullCollections()
    gc.callbacks.append(collections)
    log: list = []
    times = []
    retained = args.retained_per_step if args.retaining_ranks == "all" or rank == 0 else 0
    for step in range(args.steps):
        collections.step = step
        started = time.perf_counter()
        worker.train(shard, nll, num_tokens, one_micro_batch)
        leave_garbage(args.cycles_per_step, retained, log)
        times.append(time.perf_counter() - started)
    gc.callbacks.remove(collections)
    result = {"times": times, "collections": collections.records,
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
    return {"times": ranks[0]["times"], "collections": [r["collections"] for r in ranks]}


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    median = statistics.median(ordered)
    return {
        "median_ms": median * 1e3,
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))] * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "slow_steps": sum(t > SLOW_FACTOR * median for t in ordered),
    }


def collection_stats(per_rank: list[list[dict]], warmup: int) -> dict:
    """Full collections after warm-up: how many per rank, at which steps, their cost."""
    kept = [[c for c in rank if c["step"] >= warmup] for rank in per_rank]
    every = [c for rank in kept for c in rank]
    steps = [[int(c["step"]) for c in rank] for rank in kept]
    return {
        "full_collections": [len(rank) for rank in kept],
        "same_steps": steps[0] == steps[1],
        "steps": steps,
        "cpu_ms": [median_of(c["cpu_ms"] for c in rank) for rank in kept],
        "max_cpu_ms": max((c["cpu_ms"] for c in every), default=0.0),
        "wall_ms": median_of(c["wall_ms"] for c in every),
    }


def median_of(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def cpu_text(per_rank: list[float]) -> str:
    return "[" + ", ".join(f"{value:.0f}" for value in per_rank) + "]"


def print_tables(args: argparse.Namespace, runs: dict[str, list[dict]]) -> None:
    print(f"\n{args.steps} steps ({args.warmup} warm-up left out), 2 ranks, "
          f"{args.cycles_per_step} cycles + {args.retained_per_step} kept dicts per step "
          f"(kept on ranks: {args.retaining_ranks}); "
          f"manual_gc_interval={args.interval}")  # fmt: skip
    print(f"{'mode':<8} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} {'>3x median':>11} "
          f"{'full GCs/rank':>14} {'same steps':>10} {'GC cpu ms/rank':>14} {'GC max cpu':>10} "
          f"{'GC wall ms':>10} {'load':>5}")  # fmt: skip
    for mode, results in runs.items():
        for r in results:
            print(f"{mode:<8} {r['median_ms']:>10.1f} {r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} "
                  f"{r['slow_steps']:>11d} {str(r['full_collections']):>14} "
                  f"{str(r['same_steps']):>10} {cpu_text(r['cpu_ms']):>14} {r['max_cpu_ms']:>10.1f} "
                  f"{r['wall_ms']:>10.1f} {r['load']:>5.1f}")  # fmt: skip
    for mode, results in runs.items():
        print(f"{mode} full collections at steps (rank 0 | rank 1, last run): "
              f"{results[-1]['steps'][0]} | {results[-1]['steps'][1]}")  # fmt: skip
    medians = {mode: [r["max_ms"] for r in results] for mode, results in runs.items()}
    auto_max, manual_max = (statistics.median(medians[mode]) for mode in ("auto", "manual"))
    print(f"max step auto / manual: {auto_max / manual_max:.2f}x (medians over runs; spread "
          f"auto {min(medians['auto']):.0f}-{max(medians['auto']):.0f} ms, manual "
          f"{min(medians['manual']):.0f}-{max(medians['manual']):.0f} ms)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from hpcrl.core.models.tiny import ensure_tiny_model

    model_path = ensure_tiny_model("tiny:qwen2", cache_dir=tempfile.mkdtemp(prefix="hpcrl-gc-m-"))
    runs: dict[str, list[dict]] = {"auto": [], "manual": []}
    for repeat in range(args.repeats):
        for mode in ("auto", "manual") if repeat % 2 == 0 else ("manual", "auto"):
            result = run_mode(args, mode, model_path)
            stats = summary(result["times"][args.warmup :])
            stats.update(collection_stats(result["collections"], args.warmup))
            stats["load"] = os.getloadavg()[0]
            runs[mode].append(stats)
            print(f"run {repeat} {mode:6s} median {stats['median_ms']:6.1f} ms  max "
                  f"{stats['max_ms']:6.1f} ms  full GCs per rank {stats['full_collections']} "
                  f"(median CPU ms per rank {cpu_text(stats['cpu_ms'])})  (load {stats['load']:.1f})",
                  flush=True)  # fmt: skip
    print_tables(args, runs)


if __name__ == "__main__":
    main()
