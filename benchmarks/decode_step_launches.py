"""The torch engine's whole decode step for each decode-attention launch, on one GPU (issue 25,
item 4).

    python3 benchmarks/decode_step_launches.py [--batches 64,256] [--kinds default,grouped,dot]

Why this and not ``decode_attention_kernels.py`` alone: that script times one kernel 20 times
over the same few MB of cache, which the GPU's L2 then holds; in the engine every layer reads
its own cache from memory, between the weight GEMMs. On one H200 a launch 2.4-3.6x faster
there was no faster in the engine (docs/performance.md, item 4, sixth session). Here the step
runs as ``TorchEngine`` runs it: one ``DecodeState`` (the cache of every layer, allocated for
the benchmark's longest sequence), ``decode_forward(rows, width)`` captured in a CUDA graph
(four idempotent steps a graph), at each column bucket a ``generate`` of
``generation_throughput.py``'s shape passes through. Per launch and batch it prints the step
time per bucket and their mean weighted by the steps a generate spends in each bucket, and its
ratio to the grouped launch (``KernelLaunch()``, "the default" below: the engine's choice
under 128 rows, ``decode_launch.launch_for_rows``); every launch's logits are first checked
against the grouped launch's. The rounds alternate the
launches' order. The last lines: ``BEST-STEP-LAUNCH batch <n>: <launch>`` and ``BEST-STEP-LAUNCH
all-batches: <launch>`` (smallest mean ratio to the default), which
``benchmarks/gpu_issue25.sh`` passes to the engine rows.

``--device cpu`` (with ``TRITON_INTERPRET=1``, ``--tiny``) only checks this script: no graphs,
timings mean nothing.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from hpcrl.core.generation.decode_launch import KernelLaunch  # noqa: E402
from hpcrl.core.generation.decode_wave import column_bucket  # noqa: E402
from hpcrl.core.generation.engine_options import EngineOptions  # noqa: E402
from hpcrl.core.generation.kv_cache import DecodeState  # noqa: E402
from hpcrl.core.generation.torch_engine import TorchEngine  # noqa: E402
from hpcrl.core.models.tiny import TINY_SPECS, tiny_config  # noqa: E402

STEPS_PER_GRAPH = 4
MAX_RELATIVE_GAP = 0.05  # logits of a launch against the default's: |Δ| / |ref| (norms)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", default="llama-1b", help="a tiny-spec name (random init)")
    parser.add_argument("--tiny", action="store_true", help="the 'llama' tiny spec (CPU check)")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--prompt-min", type=int, default=20)
    parser.add_argument("--prompt-max", type=int, default=60)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--kinds", default="default,baseline,per-head,grouped,dot")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop adding launches after")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.tiny:
        args.model = "llama"
    return args


def launch_grid(kinds: str) -> list[KernelLaunch]:
    """The shipped default first, then each kind's launches; ``baseline``: the default and
    the fastest tensor-core launch of 2026-12-06's first H100 call, both reading every
    column (``read_unseen``, the kernels before that day)."""
    grid = {
        "default": [KernelLaunch()],
        "baseline": [
            KernelLaunch(read_unseen=True),
            KernelLaunch(32, 4, 3, "dot", 256, read_unseen=True),
        ],
        "per-head": [KernelLaunch(block_n=b, num_warps=1, kind="per_head") for b in (32, 16)],
        "grouped": [
            KernelLaunch(block_n=b, num_warps=w, kind="grouped")
            for b, w in itertools.product((16, 32, 64), (1, 2, 4))
        ],
        "dot": [
            KernelLaunch(block_n=b, num_warps=w, num_stages=s, kind="dot", target_programs=t)
            for t, b, w, s in itertools.product((256, 4096), (32, 64, 128), (4, 2), (3, 1))
        ],
    }
    chosen = [KernelLaunch()] + [launch for kind in kinds.split(",") for launch in grid[kind]]
    return list(dict.fromkeys(chosen))


def steps_per_bucket(args: argparse.Namespace, step: int, capacity: int) -> Counter:
    """Decode steps a generate spends in each column bucket: its prompts end at column
    ``prompt_max`` and token ``i`` (1 ≤ i < new_tokens) is fed at column end + i - 1."""
    end = args.prompt_max
    return Counter(
        column_bucket(end + i, step, capacity) for i in range(1, args.new_tokens)
    )  # fmt: skip


def build_engine(args: argparse.Namespace, capacity: int) -> TorchEngine:
    from transformers import AutoModelForCausalLM

    spec = TINY_SPECS[args.model]
    config = tiny_config(spec, spec.vocab_size or 128)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    options = EngineOptions(decode_attention="triton")
    return TorchEngine.from_hf_model(model.eval(), max_model_len=capacity, options=options)


def fill_state(state: DecodeState, args: argparse.Namespace, vocab: int) -> torch.Tensor:
    """Random cache contents and tokens; left-padded prompts of random lengths ending at
    column ``prompt_max``, as the engine lays a wave out. Returns the prompt lengths."""
    gen = torch.Generator(device=state.cache.device).manual_seed(1)
    state.cache.normal_(generator=gen)
    lengths = torch.randint(
        args.prompt_min, args.prompt_max + 1, (state.rows,), generator=gen, device=gen.device
    )  # fmt: skip
    state.tokens.random_(4, vocab, generator=gen)
    return lengths


def place_column(state: DecodeState, lengths: torch.Tensor, end: int, column: int) -> None:
    """Slots as they are when the token fed at ``column`` is decoded."""
    columns = torch.arange(state.columns, device=lengths.device)
    state.valid.copy_((columns[None] >= (end - lengths)[:, None]) & (columns[None] < column))
    state.positions.copy_(lengths + (column - end))
    state.column.fill_(column)


class StepTimer:
    """The decode step of one (rows, width) captured per launch, timed in alternating rounds."""

    def __init__(self, state: DecodeState, rows: int, width: int, device: str) -> None:
        self.state, self.rows, self.width, self.device = state, rows, width, device
        self.pool = torch.cuda.graph_pool_handle() if device == "cuda" else None

    def run_steps(self, launch: KernelLaunch) -> torch.Tensor:
        """Run the step eagerly once (compiles the launch); the logits it leaves."""
        self.state.launch = launch
        self.state.decode_forward(self.rows, self.width)
        return self.state.logits[: self.rows].clone()

    def capture(self, launch: KernelLaunch):
        self.state.launch = launch
        if self.device != "cuda":
            return lambda: [self.state.decode_forward(self.rows, self.width)] * STEPS_PER_GRAPH
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            for _ in range(STEPS_PER_GRAPH):
                self.state.decode_forward(self.rows, self.width)
        return graph.replay

    def time_ms(self, replay) -> float:
        if self.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / STEPS_PER_GRAPH
        started = time.perf_counter()
        replay()
        return (time.perf_counter() - started) * 1e3 / STEPS_PER_GRAPH


def relative_gap(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))


def time_bucket(
    timer: StepTimer, launches: list[KernelLaunch], rounds: int
) -> tuple[dict[KernelLaunch, float], dict[KernelLaunch, float]]:
    """(ms per step, logits gap to the first launch) of every launch at one bucket."""
    want = timer.run_steps(launches[0])
    gaps, replays = {}, {}
    for launch in launches:
        gaps[launch] = relative_gap(timer.run_steps(launch), want)
        if gaps[launch] <= MAX_RELATIVE_GAP:
            replays[launch] = timer.capture(launch)
    samples: dict[KernelLaunch, list[float]] = {launch: [] for launch in replays}
    for round_index in range(rounds):
        order = list(replays) if round_index % 2 == 0 else list(reversed(replays))
        for launch in order:
            samples[launch].append(timer.time_ms(replays[launch]))
    return {launch: statistics.median(s) for launch, s in samples.items()}, gaps


def measure_batch(
    state: DecodeState, lengths: torch.Tensor, args: argparse.Namespace, rows: int,
    launches: list[KernelLaunch], deadline: float,
) -> dict[KernelLaunch, float]:  # fmt: skip
    """Weighted mean ms per decode step of every launch at ``rows`` rows."""
    weights = steps_per_bucket(args, 32, state.columns)
    per_bucket: dict[int, dict[KernelLaunch, float]] = {}
    for width in sorted(weights):
        if time.monotonic() > deadline:
            print(f"  budget spent: bucket {width} and later not measured", flush=True)
            break
        first = max(width - 32, args.prompt_max)
        column = (first + min(width - 1, args.prompt_max + args.new_tokens - 2)) // 2
        place_column(state, lengths, args.prompt_max, column)
        timer = StepTimer(state, rows, width, args.device)
        times, gaps = time_bucket(timer, launches, args.rounds)
        per_bucket[width] = times
        default_ms = times[launches[0]]
        print(f"\nbatch {rows} bucket {width} (column {column}, {weights[width]} steps): "
              f"default {default_ms:.3f} ms/step", flush=True)  # fmt: skip
        for launch, gap in gaps.items():
            shown = (
                f"{times[launch]:8.3f} ms  {default_ms / times[launch]:5.2f}x"
                if launch in times
                else "  FAIL (logits differ)"
            )
            print(f"  {launch.as_text():28s} {shown}  logits gap {gap:.4f}")
        if args.device == "cuda":
            torch.cuda.empty_cache()  # the bucket's graphs are gone: their pool memory too
    measured = list(per_bucket)
    if not measured:
        return {}
    total_steps = sum(weights[w] for w in measured)
    common = set.intersection(*(set(per_bucket[w]) for w in measured))
    return {
        launch: sum(per_bucket[w][launch] * weights[w] for w in measured) / total_steps
        for launch in launches if launch in common
    }  # fmt: skip


def print_batch(rows: int, means: dict[KernelLaunch, float]) -> None:
    default = next(iter(means))
    ranked = sorted(means, key=means.__getitem__)
    print(f"\nbatch {rows}: weighted mean decode step, fastest 8 of {len(means)}")
    for launch in ranked[:8]:
        print(f"  {launch.as_text():28s} {means[launch]:.3f} ms  "
              f"{means[default] / means[launch]:.3f}x the default")  # fmt: skip
    print(f"BEST-STEP-LAUNCH batch {rows}: {ranked[0].as_text()} {means[ranked[0]]:.3f} ms "
          f"(default {means[default]:.3f} ms)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    capacity = column_bucket(args.prompt_max + args.new_tokens, 32, 1 << 30)
    engine = build_engine(args, capacity)
    state = DecodeState(engine.decoder, max(args.batches), capacity, "triton")
    lengths = fill_state(state, args, engine.decoder.shape.vocab)
    launches = launch_grid(args.kinds)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{name}: {args.model}, capacity {capacity} columns, {len(launches)} launches, "
          f"batches {args.batches}, buckets {dict(steps_per_bucket(args, 32, capacity))}",
          flush=True)  # fmt: skip
    ratios: dict[KernelLaunch, list[float]] = {}
    for rows in args.batches:
        means = measure_batch(state, lengths, args, rows, launches, deadline)
        if not means:
            continue
        print_batch(rows, means)
        for launch, ms in means.items():
            ratios.setdefault(launch, []).append(ms / means[launches[0]])
    complete = {k: v for k, v in ratios.items() if len(v) == len(args.batches)}
    if complete:
        best = min(complete, key=lambda k: statistics.mean(complete[k]))
        print(f"BEST-STEP-LAUNCH all-batches: {best.as_text()} "
              f"{statistics.mean(complete[best]):.3f}x the default's step time")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
