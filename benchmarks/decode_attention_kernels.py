"""The decode attention kernel's launch choices, side by side on one GPU (issue 25, item 4).

    python3 benchmarks/decode_attention_kernels.py [--batches 64,256] [--widths 64,128,192]

For each shape (TinyLlama's 32 query / 4 kv heads of 64, and Llama-3.1-8B's 32 / 8 of 128),
batch and cache width, every ``triton_attention.KernelLaunch`` in the grid (per query head or
per query group; column block; warps) runs captured in a CUDA graph, as the engine's decode
step runs it, 20 calls a replay; printed: µs per call, the ratio to the old default launch (``OLD_LAUNCH``)
and to the eager batched matmuls (``kv_cache.decode_attention`` plus the cache writes), and
the share of the k/v bytes' copy-bandwidth bound. Each launch's output is first checked
against the old launch's (bf16 rounding); a launch that differs is printed as FAIL and
never ranked. The last lines name the fastest launch per batch (summed over the widths).

Read its figures as the kernel's alone on a cache the GPU's L2 holds (one small cache, called
20 times in a row), not as the engine's: ``benchmarks/decode_step_launches.py`` times the
whole decode step with every layer's cache, which is what chooses the engine's launches
(docs/performance.md, item 4, seventh session). ``llama-1b`` is the shape the engine
benchmarks build (``tiny:llama-1b``: 16 query and 16 kv heads of 128).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcrl.core.generation.kv_cache import decode_attention  # noqa: E402
from hpcrl.core.generation.triton_attention import (  # noqa: E402
    KernelLaunch,
    decode_attention_triton,
)

SHAPES = {
    "llama-1b": (16, 16, 128),
    "tinyllama-1.1b": (32, 4, 64),
    "llama-3.1-8b": (32, 8, 128),
}
#: the launch before the default changed (one program per query head, 64 columns, 4 warps)
OLD_LAUNCH = KernelLaunch(block_n=64, num_warps=4, kind="per_head")
CALLS_PER_REPLAY = 20
REPLAYS = 15


def launch_grid(kinds: str = "per-head,grouped,dot") -> list[KernelLaunch]:
    """The launches to time; ``default`` is the shipped launch alone."""
    pairs = list(itertools.product((16, 32, 64, 128), (1, 2, 4, 8)))
    grid = {
        "default": [KernelLaunch()],
        "per-head": [KernelLaunch(block_n=b, num_warps=w, kind="per_head") for b, w in pairs],
        "grouped": [KernelLaunch(block_n=b, num_warps=w, kind="grouped") for b, w in pairs],
        "dot": [
            KernelLaunch(block_n=b, num_warps=w, num_stages=s, kind="dot", target_programs=t)
            for b, w, s, t in itertools.product(
                (16, 32, 64), (2, 4), (2, 3), (256, 512, 1024, 4096)
            )
        ],
    }
    chosen = [launch for kind in kinds.split(",") for launch in grid[kind]]
    return list(dict.fromkeys(chosen))


def make_case(batch: int, shape: tuple[int, int, int], width: int) -> dict:
    heads, kv_heads, head_dim = shape
    capacity = 256
    gen = torch.Generator(device="cuda").manual_seed(batch + width)
    randn = lambda *s: torch.randn(*s, generator=gen, device="cuda").bfloat16()  # noqa: E731
    starts = torch.randint(0, 40, (batch,), generator=gen, device="cuda")
    valid = torch.arange(capacity, device="cuda")[None, :] >= starts[:, None]
    column = width - 5
    valid[:, column:] = False
    angles = torch.rand(batch, head_dim // 2, generator=gen, device="cuda") * 6.0
    return {
        "q": randn(batch, heads, head_dim), "k": randn(batch, kv_heads, head_dim),
        "v": randn(batch, kv_heads, head_dim),
        "keys": randn(batch, kv_heads, capacity, head_dim),
        "values": randn(batch, kv_heads, capacity, head_dim), "valid": valid,
        "column": torch.tensor([column], device="cuda"), "width": width,
        "scale": head_dim**-0.5,
        "cos": torch.cat((angles.cos(), angles.cos()), -1).bfloat16(),
        "sin": torch.cat((angles.sin(), angles.sin()), -1).bfloat16(),
    }  # fmt: skip


def triton_call(case: dict, launch: KernelLaunch) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        return decode_attention_triton(
            case["q"], case["k"], case["v"], case["keys"], case["values"], case["valid"],
            case["column"], case["width"], case["scale"], (case["cos"], case["sin"]), launch,
        )  # fmt: skip

    return call


def eager_call(case: dict) -> Callable[[], torch.Tensor]:
    """The ``bmm`` path's kernels for one layer (rotary left out: it favours this row)."""
    rows, width = case["valid"].shape[0], case["width"]

    def call() -> torch.Tensor:
        case["valid"].index_fill_(1, case["column"], True)
        case["keys"].index_copy_(2, case["column"], case["k"].unsqueeze(2))
        case["values"].index_copy_(2, case["column"], case["v"].unsqueeze(2))
        visible = case["valid"][:, :width].view(rows, 1, 1, width)
        bias = torch.where(visible, 0.0, -3.0e38).bfloat16()
        keys, values = case["keys"][:, :, :width], case["values"][:, :, :width]
        return decode_attention(case["q"], keys, values, bias, case["scale"])

    return call


def time_in_graph_us(call: Callable[[], torch.Tensor]) -> float:
    """Median µs per call over REPLAYS replays of a graph of CALLS_PER_REPLAY calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_REPLAY):
            call()
    samples = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / CALLS_PER_REPLAY)
    return statistics.median(samples)


def copy_bandwidth_bytes_per_s() -> float:
    data = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(data)
    out.copy_(data)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        out.copy_(data)
    end.record()
    torch.cuda.synchronize()
    return 2 * 10 * data.numel() / (start.elapsed_time(end) / 1000.0)


def print_best_overall(shape_name: str, ratios: dict[KernelLaunch, list[float]]) -> None:
    """Per kind, the launch with the smallest mean time relative to the shipped default over
    every batch (the line ``benchmarks/gpu_issue25.sh`` reads for the engine's row)."""
    batches = max(map(len, ratios.values()), default=0)
    for kind in sorted({launch.kind for launch in ratios}):
        complete = {k: v for k, v in ratios.items() if k.kind == kind and len(v) == batches}
        if complete:
            fastest = min(complete, key=lambda k: statistics.mean(complete[k]))
            mean = statistics.mean(complete[fastest])
            print(f"BEST-LAUNCH {shape_name} all-batches {kind}: {fastest.as_text()} "
                  f"{mean:.2f}x the default's time")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--widths", default="64,128,192")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument(
        "--kinds",
        default="per-head,grouped,dot",
        help="which launches to time: default, per-head, grouped, dot (comma-separated)",
    )
    args = parser.parse_args(argv)
    bandwidth = copy_bandwidth_bytes_per_s()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    old = OLD_LAUNCH
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        every_batch: dict[KernelLaunch, list[float]] = {}
        for batch in (int(b) for b in args.batches.split(",")):
            totals: dict[KernelLaunch, float] = {}
            failed: set[KernelLaunch] = set()
            for width in (int(w) for w in args.widths.split(",")):
                print(f"\n{shape_name} batch {batch} width {width}")
                case = make_case(batch, shape, width)
                kv_bytes = batch * shape[1] * width * shape[2] * 2 * 2
                bound_us = kv_bytes / bandwidth * 1e6
                eager_us = time_in_graph_us(eager_call(make_case(batch, shape, width)))
                want = triton_call(make_case(batch, shape, width), old)()
                base_us = time_in_graph_us(triton_call(case, old))
                print(f"  eager bmm {eager_us:8.1f} µs   old launch {base_us:8.1f} µs   "
                      f"k/v bound {bound_us:6.1f} µs")  # fmt: skip
                for launch in launch_grid(args.kinds):
                    got = triton_call(make_case(batch, shape, width), launch)()
                    if not torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2):
                        print(f"  FAIL {launch}: differs from the old launch")
                        failed.add(launch)
                        continue
                    us = time_in_graph_us(triton_call(case, launch))
                    totals[launch] = totals.get(launch, 0.0) + us
                    print(f"  {launch!s:70s} {us:8.1f} µs  {base_us / us:5.2f}x old  "
                          f"{eager_us / us:5.2f}x eager  {bound_us / us:6.1%} of bound")  # fmt: skip
            totals = {k: v for k, v in totals.items() if k not in failed}
            best = min(totals, key=totals.__getitem__)
            chosen = KernelLaunch()
            print(f"BEST {shape_name} batch {batch}: {best} ({totals[best]:.1f} µs over the "
                  f"widths; old default {totals.get(old, 0):.1f}; now "
                  f"{chosen} {totals.get(chosen, 0):.1f})")  # fmt: skip
            for kind in sorted({launch.kind for launch in totals}):
                of_kind = {k: v for k, v in totals.items() if k.kind == kind}
                fastest = min(of_kind, key=of_kind.__getitem__)
                print(f"BEST-LAUNCH {shape_name} batch {batch} {kind}: {fastest.as_text()} "
                      f"{of_kind[fastest]:.1f} µs")  # fmt: skip
            for launch, us in totals.items():
                if chosen in totals:
                    every_batch.setdefault(launch, []).append(us / totals[chosen])
        print_best_overall(shape_name, every_batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
