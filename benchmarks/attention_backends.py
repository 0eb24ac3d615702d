"""Benchmark: causal SDPA forward + backward per backend at the training shapes, one process.

What the Automodel train step's attention costs with each of PyTorch's SDPA backends (flash,
cuDNN, memory-efficient; and PyTorch's own pick), bf16, causal, no mask: the 1.1B benchmark's
shape (batch 4 × 2048, 16 heads of 128) and a GRPO micro-batch's (32 × 192). Printed per
backend and shape: the first call on that shape (cuDNN builds a graph per shape), the median
forward + backward over ``--repeats`` calls, and TFLOP/s counting the causal half of the
scores (forward 2·2·B·H·S²·D / 2, backward 2.5× the forward).

    python benchmarks/attention_backends.py            # GPU
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

SHAPES = ((4, 16, 2048, 128), (32, 16, 192, 128))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    return parser.parse_args(argv)


def backends() -> dict[str, list]:
    from torch.nn.attention import SDPBackend

    return {
        "default": [],
        "flash": [SDPBackend.FLASH_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    }


def fwd_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor) -> None:
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(grad)


def timed_ms(fn) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - started)


def measure(choice: list, shape: tuple[int, int, int, int], repeats: int) -> dict:
    from torch.nn.attention import sdpa_kernel

    batch, heads, seq, dim = shape
    make = lambda: torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = (make().requires_grad_() for _ in range(3))
    grad = make()
    with sdpa_kernel(choice) if choice else contextlib.nullcontext():
        first = timed_ms(lambda: fwd_bwd(q, k, v, grad))
        times = [timed_ms(lambda: fwd_bwd(q, k, v, grad)) for _ in range(repeats)]
    median = statistics.median(times)
    forward_flops = 2 * 2 * batch * heads * seq * seq * dim / 2
    return {"first_ms": first, "median_ms": median,
            "tflops": 3.5 * forward_flops / (median * 1e-3) / 1e12}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"{'backend':<10} {'shape':<18} {'first ms':>9} {'fwd+bwd ms':>11} {'TFLOP/s':>8}")
    for shape in SHAPES:
        for name, choice in backends().items():
            try:
                row = measure(choice, shape, args.repeats)
            except Exception as error:  # a backend that does not take this shape
                print(
                    f"{name:<10} {'x'.join(map(str, shape)):<18} {type(error).__name__}: {error}"[
                        :160
                    ]
                )
                continue
            print(f"{name:<10} {'x'.join(map(str, shape)):<18} {row['first_ms']:9.1f} "
                  f"{row['median_ms']:11.3f} {row['tflops']:8.0f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
