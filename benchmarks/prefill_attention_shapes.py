"""What a prefill's attention costs the first time it meets a new shape, by SDPA backend.

GRPO prefills every step at a new prompt width. On the H200, steps 3-4 of the 1-GPU recipe
prefilled in 1.1-1.3 s against 0.04 s at later steps, with no new torch.compile graph and
with the packed token count already padded (2026-12-02). cuDNN's attention builds a graph
per shape (hundreds of ms, reported by others); this prints, side by side in one process,
the first and the repeated call on fresh widths for: PyTorch's default backend choice,
every backend but cuDNN (what hpcrl's prefill uses), cuDNN alone, memory-efficient alone;
and the kernels the default choice ran.

    python3 benchmarks/prefill_attention_shapes.py            # a GPU; --device cpu checks it
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CHOICES = {
    "default": None,
    "no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "cudnn-only": [SDPBackend.CUDNN_ATTENTION],
    "efficient-only": [SDPBackend.EFFICIENT_ATTENTION],
}


def inputs(rows: int, heads: int, width: int, head_dim: int, device: str, dtype: torch.dtype):
    """The prefill's shapes: padded queries and keys [rows, heads, width, dim] and a causal,
    left-padded boolean mask [rows, 1, width, width] (hpcrl.core.generation.kv_cache)."""
    q, k, v = (torch.randn(rows, heads, width, head_dim, device=device, dtype=dtype) for _ in "qkv")
    lengths = torch.randint(width // 2, width + 1, (rows,), device=device)
    key_valid = torch.arange(width, device=device)[None] >= (width - lengths)[:, None]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=device)
    return q, k, v, ((causal[None] & key_valid[:, None, :]) | eye)[:, None]


def timed_ms(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - started)


def measure(choice: str, widths: list[int], args: argparse.Namespace) -> dict[str, float]:
    firsts, repeats = [], []
    for width in widths:
        q, k, v, mask = inputs(args.rows, args.heads, width, args.head_dim, args.device, DTYPE)

        def call(q=q, k=k, v=v, mask=mask):
            if CHOICES[choice] is None:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            with sdpa_kernel(CHOICES[choice]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        try:
            firsts.append(timed_ms(call, args.device))
        except RuntimeError as error:  # this backend refuses these inputs
            return {"error": str(error).splitlines()[0][:100]}
        repeats.append(min(timed_ms(call, args.device) for _ in range(3)))
    return {"first_ms": statistics.median(firsts), "first_max_ms": max(firsts),
            "repeat_ms": statistics.median(repeats)}  # fmt: skip


def default_kernels(args: argparse.Namespace) -> list[str]:
    q, k, v, mask = inputs(args.rows, args.heads, 77, args.head_dim, args.device, DTYPE)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    names = sorted({e.key for e in prof.key_averages() if "attention" in e.key.lower()
                    or "cudnn" in e.key.lower() or "fmha" in e.key.lower()})  # fmt: skip
    return names[:8]


DTYPE = torch.bfloat16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--widths", type=int, default=6, help="fresh widths per choice")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, rows {args.rows}, heads "
          f"{args.heads}, head_dim {args.head_dim}")  # fmt: skip
    print("default choice ran:", ", ".join(default_kernels(args)) or "(no attention kernel named)")
    print(f"{'choice':<16}{'first call ms (median)':>24}{'first max':>12}{'repeat ms':>12}")
    for offset, choice in enumerate(CHOICES):
        widths = [40 + 7 * (offset * args.widths + i) for i in range(args.widths)]
        row = measure(choice, widths, args)
        if "error" in row:
            print(f"{choice:<16}  refused: {row['error']}")
            continue
        print(f"{choice:<16}{row['first_ms']:>24.2f}{row['first_max_ms']:>12.2f}"
              f"{row['repeat_ms']:>12.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
