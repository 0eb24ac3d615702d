"""One optimizer step of AdamW with part of its state in host memory
(``hpcrl.core.backends.automodel.host_offload.HostOffloadAdam``) against torch's fused AdamW
on the GPU, in one process, alternating:

    python benchmarks/host_offload_step.py [--billions 2.0] [--repeats 3]

First a parity check through the real copies (device to host, host to device, pinned staging,
two streams): 3 steps of each fraction against fused AdamW on a 50M-parameter set, largest
difference printed (tolerance 1e-5 relative). Then the timing: fp32 parameters of
``--billions`` x 1e9 elements in 64M-element tensors (an 8B Llama's largest matrices are
58-525M), gradients set, the step timed (CUDA synchronised) for the fractions 0 (plain fused
AdamW), 0.5 and 1.0; GPU memory held by the optimizer state and the host threads used, and
each fraction's time as a ratio to plain. Needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from hpcrl.core.backends.automodel.host_offload import HostOffloadAdam

KWARGS = {"lr": 1e-3, "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8}


def _params(total: int, piece: int, seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    sizes = [piece] * (total // piece) + ([total % piece] if total % piece else [])
    params = []
    for size in sizes:
        param = torch.nn.Parameter(torch.randn(size, device="cuda", generator=generator))
        param.grad = torch.randn(size, device="cuda", generator=generator) * 1e-2
        params.append(param)
    return params


def _optimizer(params, fraction: float, threads: int) -> torch.optim.Optimizer:
    if fraction == 0:
        return torch.optim.AdamW(params, fused=True, **KWARGS)
    return HostOffloadAdam(
        params,
        offload_fraction=fraction,
        host_threads=threads,
        decoupled_weight_decay=True,
        fused=True,
        **KWARGS,
    )


def parity(threads: int) -> None:
    reference = _params(50_000_000, 7_000_000, seed=1)
    plain = _optimizer(reference, 0, threads)
    for _ in range(3):
        plain.step()
    for fraction in (0.5, 1.0):
        params = _params(50_000_000, 7_000_000, seed=1)
        hybrid = _optimizer(params, fraction, threads)
        for _ in range(3):
            hybrid.step()
        worst = max(
            float(((a - b).abs() / b.abs().clamp_min(1e-3)).max())
            for a, b in zip(params, reference, strict=True)
        )
        verdict = "OK" if worst < 1e-5 else "MISMATCH"
        print(f"parity fraction {fraction}: largest relative difference {worst:.2e} {verdict}")


def timing(billions: float, repeats: int, threads: int) -> None:
    total = int(billions * 1e9)
    params = _params(total, 64 * 2**20, seed=2)
    plain_s = None
    for fraction in (0.0, 0.5, 1.0):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        optimizer = _optimizer(params, fraction, threads)
        times = []
        for _ in range(repeats + 1):  # the first builds the state
            torch.cuda.synchronize()
            started = time.perf_counter()
            optimizer.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        state_gib = (torch.cuda.memory_allocated() - before) / 2**30
        best = min(times[1:])
        plain_s = plain_s or best
        print(
            f"{billions:g}B params, fraction {fraction}: step {best:.3f} s (best of {repeats}; "
            f"first {times[0]:.2f} s), GPU optimizer state {state_gib:.1f} GiB, "
            f"{best / plain_s:.1f}x plain fused AdamW, {total * 4 / best / 1e9:.1f} GB/s of "
            "parameters"
        )
        del optimizer
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--billions", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, host threads {threads}")
    parity(threads)
    timing(args.billions, args.repeats, threads)


if __name__ == "__main__":
    main()
