"""Benchmark: what torch.compile costs the first GRPO step of a warm run, this checkout against
another tree (main's), on CPU with Inductor's CPU backend.

One process is one worker's first step, in GRPO's order, with the compile cache folder of
its tree: the torch engine's compiled pieces (``Pointwise.fused``, ``fused_sampler``: the
CUDA path's, compiled for the CPU here) generate, then the real ``AutomodelWorker``
(``compile_on_cpu``) runs the policy's log-prob pass, the reference's and a train step. Per
tree one cold process fills a fresh cache; then warm processes alternate between the trees.
Printed: frames dynamo compiled (recompilations included), graphs, cache hits / misses, torch.compile seconds
(``hpcrl.core.compile_stats``) and each phase's wall, median over the warm runs, side by side
with the ratio. The GPU's own figures come from ``benchmarks/first_step_cache.py``.

    python benchmarks/warm_compile_cpu.py                       # against /work/main
    python benchmarks/warm_compile_cpu.py --baseline /path/to/other/checkout --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PHASES = ("setup_s", "generate_s", "logprobs_s", "reference_s", "train_s")
COUNTS = ("frames", "graphs", "compile_cache_hits", "compile_cache_misses", "compile_time_s")
#: the kept compilations (aot_precompiled's tally): loaded in the worker's setup, at a first
#: call, and refused by their guards; absent in trees older than the tally (printed as 0)
AOT_COUNTS = ("aot_loads_in_setup", "aot_loads", "aot_guard_rejections")

#: One warm (or cold) first step, in a fresh interpreter; prints one JSON line.
ONE_STEP = """
import json, os, socket, sys, time
import torch, torch.distributed as dist, transformers
from torch._dynamo.utils import compilation_time_metrics, counters
from hpcrl.config.recipe_policy import GenerationCfg
from hpcrl.core.backends.automodel.worker import AutomodelWorker
from hpcrl.core.backends.base import RankInfo
from hpcrl.core.compile_stats import compile_cache_counts
from hpcrl.core.generation.decoder import Pointwise
from hpcrl.core.generation.sampling import fused_sampler
from hpcrl.core.generation.torch_engine import TorchEngine
from tests.core.parallel_harness import make_batch, masked_nll_loss
from tests.recipe_builder import tiny_automodel_recipe

torch.set_num_threads(1)
path = sys.argv[1]
figures = {}
def timed(name, call):
    started = time.perf_counter()
    result = call()
    figures[name] = time.perf_counter() - started
    return result
hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
engine = TorchEngine.from_hf_model(hf)
engine.decoder.pointwise = Pointwise.fused()
engine.sample_tokens = fused_sampler()
prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
timed("generate_s", lambda: engine.generate(prompts, GenerationCfg(temperature=1.0, max_new_tokens=8), seed=0))
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
worker = type("CompilingWorker", (AutomodelWorker,), {"compile_on_cpu": True})()
info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                master_addr="127.0.0.1", master_port=port, device="cpu")
loads_before = compile_cache_counts().get("aot_loads", 0)  # the engine's pieces'
timed("setup_s", lambda: worker.setup(tiny_automodel_recipe(micro_batch_size=2), info, path))
figures["aot_loads_in_setup"] = compile_cache_counts().get("aot_loads", 0) - loads_before
batch = make_batch(0, batch_size=2, seq_len=24)
timed("logprobs_s", lambda: worker.logprobs(batch))
timed("reference_s", lambda: worker.reference_logprobs(batch))
timed("train_s", lambda: worker.train_step([batch], masked_nll_loss, float(batch["token_mask"].sum())))
figures.update(compile_cache_counts())
# frames dynamo traced (an ahead-of-time load or build goes through no compile_inner)
figures["frames"] = len(compilation_time_metrics.get("_compile.compile_inner", []))
figures["graphs"] = counters["stats"]["unique_graphs"]
print(json.dumps(figures), flush=True)
os._exit(0)  # gloo's threads may abort a normal interpreter exit
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=Path("/work/main"), help="other tree")
    parser.add_argument("--repeats", type=int, default=2, help="warm processes per tree")
    return parser.parse_args(argv)


def one_step(tree: Path, cache: Path, model: str) -> dict[str, float]:
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", ONE_STEP, model],
        capture_output=True, text=True, cwd=tree, env=env, timeout=1200,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{tree}: exit {result.returncode}\n{result.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run.get(key, 0.0) for run in runs)


def print_table(trees: dict[str, list[dict[str, float]]], colds: dict[str, dict]) -> None:
    names = list(trees)
    print(f"{'warm first step (median)':28s}" + "".join(f"{n:>14s}" for n in names) + "   ratio")
    for key in COUNTS + AOT_COUNTS + PHASES:
        values = [median_of(trees[name], key) for name in names]
        ratio = f"{values[0] / values[1]:7.2f}x" if values[1] else "      -"
        print(f"{key:28s}" + "".join(f"{v:14.2f}" for v in values) + "   " + ratio)
    print("cold misses / compile s:  " + ", ".join(
        f"{name} {colds[name]['compile_cache_misses']:.0f} / {colds[name]['compile_time_s']:.1f}"
        for name in names))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))
    from hpcrl.core.models.tiny import ensure_tiny_model

    model = ensure_tiny_model("tiny:qwen2")
    trees = {"this": REPO_ROOT, "baseline": args.baseline.resolve()}
    with tempfile.TemporaryDirectory(prefix="warm-compile-") as scratch:
        caches = {name: Path(scratch) / name for name in trees}
        colds = {name: one_step(tree, caches[name], model) for name, tree in trees.items()}
        warm: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                warm[name].append(one_step(tree, caches[name], model))
                print(f"repeat {repeat} {name}: {json.dumps(warm[name][-1])}", flush=True)
    print_table(warm, colds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
