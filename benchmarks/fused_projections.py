"""Benchmark: a decoder block's projections as separate matmuls against one fused matmul.

What fusing Q/K/V (and gate/up) into one weight would save in the Automodel train step
(issue 25, item 1), before building it: the forward, input-gradient and weight-gradient
matmuls of the 1.1B's projections at the train shape (4 x 2048 tokens, hidden 2048, FFN
5632), bf16, separate (three / two weights, the input gradients summed as autograd sums
them) against fused (one weight of the stacked rows), timed with CUDA events in alternating
rounds. Prints milliseconds per block and the fused / separate ratio per group.

    python benchmarks/fused_projections.py --device cuda

Measured 2026-12-06 (one H100): Q/K/V fused / separate 0.868, gate/up 0.934. Built into the
Automodel worker, the whole train step was 0.99x the separate projections' (the backward's
split became a concatenation of the input gradients that Inductor wrote with ~2.3 ms more
pointwise work a step than it saved in matmuls); reverted (docs/performance.md, item 1).
"""

from __future__ import annotations

import argparse
import statistics

import torch


def separate(x, grad_outs, weights):
    """Forward, input gradient (summed) and weight gradients of each projection alone."""
    outs = [x @ w.t() for w in weights]
    grad_x = sum(g @ w for g, w in zip(grad_outs, weights, strict=True))
    grad_ws = [g.t() @ x for g in grad_outs]
    return outs, grad_x, grad_ws


def fused(x, grad_out, weight):
    """The same with the weights stacked: one matmul each way."""
    return x @ weight.t(), grad_out @ weight, grad_out.t() @ x


def time_ms(fn, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=4 * 2048)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--kv-dim", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    assert args.device == "cuda", "CUDA events time this benchmark"
    dtype, dev = torch.bfloat16, args.device
    x = torch.randn(args.tokens, args.hidden, device=dev, dtype=dtype)
    groups = {
        "qkv": [args.hidden, args.kv_dim, args.kv_dim],
        "gate_up": [args.ffn, args.ffn],
    }
    for name, rows in groups.items():
        weights = [torch.randn(r, args.hidden, device=dev, dtype=dtype) / 50 for r in rows]
        grads = [torch.randn(args.tokens, r, device=dev, dtype=dtype) for r in rows]
        stacked, grad_stacked = torch.cat(weights), torch.cat(grads, dim=1)
        cases = {
            "separate": lambda grads=grads, weights=weights: separate(x, grads, weights),
            "fused": lambda g=grad_stacked, w=stacked: fused(x, g, w),
        }
        for fn in cases.values():
            time_ms(fn, 3)
        times: dict[str, list[float]] = {case: [] for case in cases}
        for round_index in range(args.rounds):
            order = list(cases) if round_index % 2 == 0 else list(reversed(cases))
            for case in order:
                times[case].append(time_ms(cases[case], args.repeats))
        flops = 6 * args.tokens * args.hidden * sum(rows)
        medians = {case: statistics.median(values) for case, values in times.items()}
        for case, ms in medians.items():
            print(f"{name:8s} {case:9s} {ms:7.3f} ms  {flops / ms / 1e9:6.0f} TFLOP/s")
        print(f"{name:8s} fused / separate {medians['fused'] / medians['separate']:.3f}")


if __name__ == "__main__":
    main()
