"""Benchmark: the torch engine's sampler, eager against fused, side by side, one process.

One decode step's sampling as the engine runs it after the graph's replay: float32 logits
``[rows, vocab]`` (the 1.1B Llama shape's vocabulary, 128,256), the wave's counter-based
uniforms, and ``sampling.sample_tokens`` (eager; the CPU path, and CUDA's before issue 12's
third session) against ``sampling.fused_sampler`` (torch.compile'd ``pick_tokens``; the
CUDA path), for temperature 1, temperature 0.7 + top-k 50, top-p 0.9 and greedy, at batches
64 and 256. Per row: the median time per call, the ratio, the kernels one call launches
(torch.profiler; on CUDA only) and a self-check; a failure prints FAIL and the script exits 1
after the table. The check: greedy tokens equal; a sampled token of either sampler is an
inverse-CDF pick of its uniform up to float32 rounding (the uniform's target lies within
``PICK_TOLERANCE`` of the float64 CDF interval of the token), and where both pick the same
token their log-probs agree to 1e-4. Tokens may differ at a CDF boundary: the fused scan sums
in another order (on the H200, 1 row in 256 at vocabulary 128,256). The compilation (the
first fused call of each distribution) is timed apart.

    python3 benchmarks/sampler_throughput.py            # a GPU
    python3 benchmarks/sampler_throughput.py --tiny     # CPU smoke test (timings mean nothing)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from hpcrl.core.generation.sampling import fused_sampler, row_uniforms, sample_tokens  # noqa: E402
from hpcrl.core.token_distribution import TokenDistribution, processed_logits  # noqa: E402

DISTRIBUTIONS = {
    "t1": (TokenDistribution(), False),
    "t0.7-topk50": (TokenDistribution(temperature=0.7, top_k=50), False),
    "topp0.9": (TokenDistribution(top_p=0.9), False),
    "greedy": (TokenDistribution(), True),
}


#: How far (a fraction of the total mass) a pick's CDF interval may lie from its target: the
#: float32 CDF of 128k entries is off the float64 one by up to ~1e-5 of the mass (measured).
PICK_TOLERANCE = 1e-3


def pick_distance(
    logits: torch.Tensor,
    distribution: TokenDistribution,
    uniforms: torch.Tensor,
    tokens: torch.Tensor,
) -> float:
    """Largest distance, as a fraction of the mass, from a row's inverse-CDF target to the
    float64 CDF interval of the token picked (0: an exact pick)."""
    probs = torch.softmax(processed_logits(logits.float(), distribution).double(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = uniforms.double() * cdf[:, -1]
    high = cdf.gather(-1, tokens[:, None])[:, 0]
    low = high - probs.gather(-1, tokens[:, None])[:, 0]
    outside = torch.maximum(low - target, target - high).clamp(min=0)
    return float((outside / cdf[:, -1]).max())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--tiny", action="store_true", help="vocab 2048, batches 4,16, 3 calls")
    args = parser.parse_args(argv)
    if args.tiny:
        args.vocab, args.batches, args.iterations = 2048, "4,16", 3
    return args


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(call, iterations: int, device: str) -> float:
    times = []
    for _ in range(iterations):
        synchronize(device)
        started = time.perf_counter()
        call()
        synchronize(device)
        times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def kernels_per_call(call, device: str) -> int | None:
    """Device kernels one call launches (None off CUDA)."""
    if not device.startswith("cuda"):
        return None
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        call()
        synchronize(device)
    kinds = (torch.autograd.DeviceType.CUDA,)
    return sum(1 for event in prof.events() if event.device_type in kinds)


def measure(name: str, rows: int, args: argparse.Namespace, fused) -> dict:
    distribution, greedy = DISTRIBUTIONS[name]
    gen = torch.Generator(device=args.device).manual_seed(rows)
    logits = 3 * torch.randn(rows, args.vocab, device=args.device, generator=gen)
    uniforms = row_uniforms(7, torch.arange(rows, device=args.device), 0)

    def eager_call():
        return sample_tokens(logits, distribution, uniforms, greedy=greedy)

    def fused_call():
        return fused(logits, distribution, uniforms, greedy=greedy)

    synchronize(args.device)
    started = time.perf_counter()
    fused_call()  # compiles (once per distribution; later batch sizes reuse it)
    synchronize(args.device)
    first_s = time.perf_counter() - started
    eager_call()
    want_tokens, want_logprobs = eager_call()
    tokens, logprobs = fused_call()
    equal = tokens == want_tokens
    same = float(equal.float().mean())
    gap = float((logprobs - want_logprobs)[equal].abs().max()) if bool(equal.any()) else 0.0
    if greedy:
        distance, ok = 0.0, same == 1.0 and gap <= 1e-4
    else:
        distance = max(pick_distance(logits, distribution, uniforms, t)
                       for t in (tokens, want_tokens))  # fmt: skip
        ok = distance <= PICK_TOLERANCE and gap <= 1e-4
    return {
        "first_s": first_s,
        "eager_ms": median_ms(eager_call, args.iterations, args.device),
        "fused_ms": median_ms(fused_call, args.iterations, args.device),
        "eager_kernels": kernels_per_call(eager_call, args.device),
        "fused_kernels": kernels_per_call(fused_call, args.device),
        "same_tokens": same,
        "logprob_gap": gap,
        "pick_distance": distance,
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":  # OpenMP threads of compiled kernels stall on a shared box
        torch.set_num_threads(1)
    print(f"torch {torch.__version__}, device {args.device}, vocab {args.vocab}")
    fused = fused_sampler()
    header = (
        f"{'batch':>5}  {'distribution':<12}{'eager ms':>10}{'fused ms':>10}{'eager/fused':>13}"
        f"{'kernels e/f':>13}{'first fused s':>15}  self-check"
    )
    print(header)
    failed = False
    for rows in (int(b) for b in args.batches.split(",")):
        for name in DISTRIBUTIONS:
            row = measure(name, rows, args, fused)
            kernels = (
                f"{row['eager_kernels']}/{row['fused_kernels']}"
                if row["eager_kernels"] is not None
                else "-"
            )
            check = "PASS" if row["ok"] else "FAIL"
            failed |= not row["ok"]
            print(
                f"{rows:>5}  {name:<12}{row['eager_ms']:>10.3f}{row['fused_ms']:>10.3f}"
                f"{row['eager_ms'] / row['fused_ms']:>12.2f}x{kernels:>13}"
                f"{row['first_s']:>15.2f}  {check} (same tokens {row['same_tokens']:.4f}, "
                f"log-prob gap where equal {row['logprob_gap']:.1e}, "
                f"pick off its target by {row['pick_distance']:.1e})"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
