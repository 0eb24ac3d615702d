"""Benchmark: what a hand-written add + RMSNorm would save in the Automodel train step.

Issue 25, item 1: after the bf16 residual stream the norms' backward kernels still take 102 +
70 µs a layer on an H100 (docs/performance.md, fifth session), where reading and writing the
tensors once takes ~45 µs: Inductor writes the weight gradient's per-row products in float32
and sums them in a second kernel. Before building it into the decoder block, this times the
block's norm as the worker runs it (HF's RMSNorm formula after the residual add, fp32 weight,
the output cast to bf16 as autocast does for the next matmul) compiled by Inductor, against
two Triton kernels: a forward (add, norm, cast; saves the sum and each row's 1/rms) and a
backward that reads each tensor once and keeps the weight gradient's partial sums per program.
Forward + backward at the train shape (4 x 2048 tokens, hidden 2048), CUDA events,
alternating rounds; first a parity check of outputs and gradients against the compiled path.

    python benchmarks/rms_norm_backward.py            # one GPU

Prints µs per call of each (Inductor with static and with dynamic sizes, as the worker
compiles its blocks), the Triton / Inductor ratios, and the bytes roofline.

Measured 2026-12-06 (one H100, 8192 x 2048, CUDA graphs): Inductor static 108.3 µs, dynamic
204.8 µs, these Triton kernels 120.7 µs (parity PASS, errors ≤ 5e-3 of the max); at 2048
tokens 33.6 / 57.4 / 64.5 µs. In the train step both the backend (dynamic sizes) and the
plain loop (static) spend ~132 µs a norm (forward + backward kernels, profiles of
docs/performance.md's item 1, fifth session): the block's fused graph does not pay the
standalone function's dynamic-size cost, and these kernels would save ~10 µs a norm (~0.3 ms
a step). Not built into the worker: the lever is not there.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

EPS = 1e-5


def hf_add_norm(residual, delta, weight):
    """The block's add + norm as HF writes it, and autocast's cast of the result."""
    hidden = residual + delta
    as_float = hidden.float()
    variance = as_float.pow(2).mean(-1, keepdim=True)
    normed = (as_float * torch.rsqrt(variance + EPS)).to(hidden.dtype)
    return hidden, (weight * normed).to(torch.bfloat16)


@triton.jit
def _forward_kernel(
    res_ptr, delta_ptr, w_ptr, hidden_ptr, out_ptr, rstd_ptr, N: tl.constexpr, EPS_C: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, N)
    summed = tl.load(res_ptr + row * N + cols).to(tl.float32)
    summed += tl.load(delta_ptr + row * N + cols).to(tl.float32)
    hidden = summed.to(tl.bfloat16)
    tl.store(hidden_ptr + row * N + cols, hidden)
    x = hidden.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + EPS_C)
    tl.store(rstd_ptr + row, rstd)
    normed = (x * rstd).to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (tl.load(w_ptr + cols) * normed).to(tl.bfloat16))


@triton.jit
def _backward_kernel(
    hidden_ptr,
    w_ptr,
    rstd_ptr,
    gout_ptr,
    ghidden_ptr,
    gx_ptr,
    gw_part_ptr,
    M,
    N: tl.constexpr,
    ROWS: tl.constexpr,
):
    program = tl.program_id(0)
    cols = tl.arange(0, N)
    w = tl.load(w_ptr + cols)
    gw = tl.zeros((N,), tl.float32)
    for i in range(ROWS):
        row = program * ROWS + i
        if row < M:
            x = tl.load(hidden_ptr + row * N + cols).to(tl.float32)
            rstd = tl.load(rstd_ptr + row)
            xhat = x * rstd
            gout = tl.load(gout_ptr + row * N + cols).to(tl.float32)
            gw += gout * xhat.to(tl.bfloat16).to(tl.float32)
            gxhat = (gout * w).to(tl.bfloat16).to(tl.float32)
            gx = rstd * (gxhat - xhat * (tl.sum(gxhat * xhat, axis=0) / N))
            gx = gx.to(tl.bfloat16).to(tl.float32)
            total = gx + tl.load(ghidden_ptr + row * N + cols).to(tl.float32)
            tl.store(gx_ptr + row * N + cols, total.to(tl.bfloat16))
    tl.store(gw_part_ptr + program * N + cols, gw)


class TritonAddNorm(torch.autograd.Function):
    ROWS = 32

    @staticmethod
    def forward(ctx, residual, delta, weight):
        rows, width = residual.shape
        hidden, out = torch.empty_like(residual), torch.empty_like(residual)
        rstd = torch.empty(rows, dtype=torch.float32, device=residual.device)
        _forward_kernel[(rows,)](residual, delta, weight, hidden, out, rstd, N=width, EPS_C=EPS)
        ctx.save_for_backward(hidden, weight, rstd)
        return hidden, out

    @staticmethod
    def backward(ctx, grad_hidden, grad_out):
        hidden, weight, rstd = ctx.saved_tensors
        rows, width = hidden.shape
        programs = triton.cdiv(rows, TritonAddNorm.ROWS)
        grad_x = torch.empty_like(hidden)
        partial = torch.empty(programs, width, dtype=torch.float32, device=hidden.device)
        _backward_kernel[(programs,)](
            hidden, weight, rstd, grad_out.contiguous(), grad_hidden.contiguous(), grad_x,
            partial, rows, N=width, ROWS=TritonAddNorm.ROWS,
        )  # fmt: skip
        return grad_x, grad_x, partial.sum(0)


def run(fn, inputs, grads):
    """Forward and backward; ``autograd.grad``: nothing accumulates into ``.grad``."""
    hidden, out = fn(*inputs)
    return torch.autograd.grad([hidden, out], inputs, grads)


def graphed(fn, inputs, grads):
    """``fn``'s forward + backward captured in a CUDA graph (no host time in the timing);
    the eager call where capture fails."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile, autotune
            run(fn, inputs, grads)
    torch.cuda.current_stream().wait_stream(side)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run(fn, inputs, grads)
        return graph.replay, "CUDA graph"
    except RuntimeError as error:
        print(f"capture failed ({error}); timing eager calls")
        return (lambda: run(fn, inputs, grads)), "eager"


def time_us(call, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def parity(reference, inputs, grads) -> None:
    results = []
    for fn in (reference, TritonAddNorm.apply):
        out = fn(*inputs)[1]
        results.append([out.float(), *[g.float() for g in run(fn, inputs, grads)]])
    names = ("output", "residual grad", "delta grad", "weight grad")
    for name, want, got in zip(names, *results, strict=True):
        error = ((got - want).abs().max() / want.abs().max()).item()
        print(
            f"parity {name}: max error / max value {error:.2e} {'PASS' if error < 2e-2 else 'FAIL'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4 * 2048)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape, dev = (args.tokens, args.hidden), "cuda"
    residual = torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True)
    delta = torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True)
    weight = (1 + 0.1 * torch.randn(args.hidden, device=dev)).requires_grad_(True)
    grads = [torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    inputs = (residual, delta, weight)
    compiled = torch.compile(hf_add_norm)
    parity(compiled, inputs, grads)
    calls = {}
    # the worker compiles its blocks with dynamic sizes (``apply_compile``)
    dynamic = torch.compile(hf_add_norm, dynamic=True)
    for name, fn in (
        ("inductor", compiled),
        ("inductor-dynamic", dynamic),
        ("triton", TritonAddNorm.apply),
    ):
        calls[name], mode = graphed(fn, inputs, grads)
        print(f"{name}: timed as {mode}")
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_index in range(args.rounds):
        order = list(calls) if round_index % 2 == 0 else list(reversed(calls))
        for name in order:
            times[name].append(time_us(calls[name], args.repeats))
    bf16_bytes = args.tokens * args.hidden * 2
    # forward: read 2, write 2; backward: read 3 (sum, output grad, sum's grad), write 1
    roofline_gb = 8 * bf16_bytes / 1e9
    for name, values in times.items():
        print(f"{name}: {statistics.median(values):.1f} us per forward + backward "
              f"(rounds {min(values):.1f}-{max(values):.1f})")  # fmt: skip
    for baseline in ("inductor", "inductor-dynamic"):
        ratio = statistics.median(times["triton"]) / statistics.median(times[baseline])
        print(f"triton / {baseline}: {ratio:.3f}")
    print(f"bytes moved at best {roofline_gb * 1e3:.0f} MB "
          f"({roofline_gb / 3350 * 1e6:.0f} us at 3.35 TB/s)")  # fmt: skip


if __name__ == "__main__":
    main()
