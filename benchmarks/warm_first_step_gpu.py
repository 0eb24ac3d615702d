"""Benchmark (GPU): where a warm run's first GRPO step goes, one fresh process per first step.

One process is one rank's first step and its second, in GRPO's order, on CUDA: the torch
engine (compiled pieces, CUDA graphs) generates, then the real ``AutomodelWorker`` (compiled
blocks) runs the policy's log-prob pass, the reference's and a train step; then all of it
again (the steady figures of the same process). The first process of a variant fills its
compile cache (cold), the later ones find it (warm). Printed per process: each phase's first
and second wall, torch.compile's seconds, cache hits / misses, full GCs and their seconds in
each step (after the actor's ``ManualGc.after_setup``, which ``WFS_AFTER_SETUP=0`` leaves
out: ``--variant plain:WFS_AFTER_SETUP=0,CACHE=base``; and after its ``pay_triton_key``,
which ``WFS_TRITON_KEY=0`` leaves out), the kept compilations loaded in setup and any
refusal of their guards with its reason, first / second; with
``--profile`` the warm process's cProfile top functions (where the warm seconds go).

    python benchmarks/warm_first_step_gpu.py --cache /tmp/wfs [--variant NAME=ENV=V,...]

``benchmarks/first_step_cache.py`` measures the same through ``hpcrl submit`` (Ray, the driver).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

ONE_PROCESS = r"""
import cProfile, io, json, os, pstats, socket, sys, time
started_s = time.perf_counter()
import attrs, torch, torch.distributed as dist, transformers
from hpcrl.config.recipe_policy import GenerationCfg
from hpcrl.core.backends.automodel.worker import AutomodelWorker
from hpcrl.core.backends.base import RankInfo
from hpcrl.core.compile_stats import compile_cache_counts
from hpcrl.core.generation.torch_engine import TorchEngine
from tests.core.parallel_harness import make_batch, masked_nll_loss
from tests.recipe_builder import tiny_automodel_recipe

path, profile = sys.argv[1], sys.argv[2] == "1"
on_gpu = torch.cuda.is_available()
if not on_gpu:  # the CPU smoke check of this script: nothing compiles
    torch.cuda.synchronize = lambda: None
figures = {"import_s": time.perf_counter() - started_s}
def timed(name, call):
    torch.cuda.synchronize()
    begun = time.perf_counter()
    result = call()
    torch.cuda.synchronize()
    figures[name] = round(time.perf_counter() - begun, 3)
    return result
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]
dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                        device_id=torch.device("cuda", 0) if on_gpu else None)  # as the actor
recipe = tiny_automodel_recipe(micro_batch_size=32)
recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, model_name=sys.argv[3],
                                                  precision="bfloat16" if on_gpu else "float32"))
worker = AutomodelWorker()
info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                master_addr="127.0.0.1", master_port=port, device="cuda" if on_gpu else "cpu")
timed("setup_s", lambda: worker.setup(recipe, info, path))
figures["aot_loads_in_setup"] = compile_cache_counts().get("aot_loads", 0)  # the blocks' preload
if os.environ.get("WFS_TRITON_KEY", "1") == "1":  # the actor's setup pays Triton's key
    from hpcrl.core.workers.first_launch import pay_triton_key
    timed("triton_key_s", pay_triton_key)
if os.environ.get("WFS_AFTER_SETUP", "1") == "1":  # what the worker's Ray actor does next
    from hpcrl.core.workers.manual_gc import ManualGc
    ManualGc.from_recipe(recipe).after_setup()
full_gcs = []  # (phase, generation, perf_counter) of every collection from here on
import gc
gc.callbacks.append(lambda phase, info: full_gcs.append((phase, info["generation"], time.perf_counter())))
def gc_figures(tag):
    starts = [t for p, g, t in full_gcs if p == "start" and g == 2]
    stops = [t for p, g, t in full_gcs if p == "stop" and g == 2]
    figures["full_gcs" + tag] = len(starts)
    figures["full_gc_s" + tag] = round(sum(b - a for a, b in zip(starts, stops)), 3)
    full_gcs.clear()
hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if on_gpu else torch.float32).to(info.device).eval()
engine = TorchEngine.from_hf_model(hf)
del hf
gen = torch.Generator().manual_seed(0)
prompts = [torch.randint(4, 30000, (int(n),), generator=gen).tolist()
           for n in torch.randint(20, 60, (64,), generator=gen)]
batch = make_batch(0, batch_size=64 if on_gpu else 4, seq_len=320 if on_gpu else 24, vocab=30000 if on_gpu else 100)
cfg = GenerationCfg(temperature=1.0, max_new_tokens=128 if on_gpu else 8)
if not on_gpu:
    prompts = [[t % 100 for t in p[:8]] for p in prompts[:4]]
def step(tag):
    timed("generate" + tag, lambda: engine.generate(prompts, cfg, seed=0))
    figures["prefill" + tag] = round(engine.last_stats.prefill_s, 3)
    figures["decode" + tag] = round(engine.last_stats.decode_s, 3)
    figures["captures" + tag] = engine.last_stats.graph_captures
    timed("logprobs" + tag, lambda: worker.logprobs(batch))
    timed("reference" + tag, lambda: worker.reference_logprobs(batch))
    timed("train" + tag, lambda: worker.train_step(
        [batch], masked_nll_loss, float(batch["token_mask"].sum())))
profiler = cProfile.Profile() if profile else None
if profiler: profiler.enable()
timed("first_step_s", lambda: step("_1"))
if profiler: profiler.disable()
gc_figures("_1")
figures.update(compile_cache_counts())
pieces = [getattr(engine.decoder.pointwise, n) for n in ("add_rms_norm", "rotate_pair", "silu_mul", "masked_softmax")]
kept = [getattr(p, "precompiled", None) for p in pieces]
figures["engine_aot_loads"] = sum(k.loads for k in kept if k)
figures["engine_aot_builds"] = sum(k.builds for k in kept if k)
figures["aot_failures"] = [f[:300] for k in kept if k for f in k.failures]
blocks = worker.block_compilations.pieces  # a refusal's failing guard, as the log has it
figures["block_rejections"] = [r[:600] for r in blocks.rejections] if blocks else None
timed("second_step_s", lambda: step("_2"))
gc_figures("_2")
figures["first_over_second"] = round(figures["first_step_s"] / figures["second_step_s"], 2)
from torch._dynamo.utils import compile_times, counters
figures["graphs"] = counters["stats"]["unique_graphs"]
print(compile_times(repr="str", aggregate=True), file=sys.stderr)
if profiler:
    for key in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(45)
        print(text.getvalue()[-9000:], file=sys.stderr)
print(json.dumps(figures), flush=True)
os._exit(0)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="compile caches' root")
    parser.add_argument("--warm", type=int, default=2, help="warm processes per variant")
    parser.add_argument("--model", default="tiny:llama-1b", help="tiny:qwen2 for a CPU smoke")
    parser.add_argument("--profile", action="store_true", help="cProfile the last warm one")
    parser.add_argument(
        "--variant", action="append", default=[],
        help="NAME or NAME:VAR=V,... (a cache of its own unless CACHE=another variant's)",
    )  # fmt: skip
    return parser.parse_args(argv)


def one_process(cache: Path, extra: dict[str, str], model: str, name: str, profile: bool) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        **extra,
    }  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", ONE_PROCESS, model, "1" if profile else "0", name],
        capture_output=True, text=True, cwd="/tmp", env=env, timeout=900,
    )  # fmt: skip
    if result.returncode != 0 or profile:
        print(result.stderr[-20000:], flush=True)
    if result.returncode != 0:
        print(f"exit {result.returncode}", flush=True)
        return
    print(result.stdout.strip().splitlines()[-1], flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))
    from hpcrl.core.models.tiny import ensure_tiny_model

    model = ensure_tiny_model(args.model)
    for variant in args.variant or ["base"]:
        name, _, assignments = variant.partition(":")
        extra = dict(a.split("=", 1) for a in assignments.split(",") if a)
        cache = args.cache / extra.pop("CACHE", name)  # CACHE=other: that variant's cache
        for index in range(1 if cache.exists() else 0, args.warm + 1):
            kind = "cold" if index == 0 else "warm"
            print(f"== {name} {kind} {index} {extra}", flush=True)
            one_process(cache, extra, model, args.model, args.profile and index == args.warm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
