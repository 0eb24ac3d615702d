"""Where the torch engine's prefill spends its wall time, on one GPU (issue 25, item 4).

    python3 benchmarks/prefill_profile.py [--batches 64,256]

The prefill is eager (no CUDA graph: every wave's prompt widths differ); at 64 rows of 20-60
tokens it took 26-39 ms of a 260 ms generate on one H100 while its kernels were ~11 ms
(docs/performance.md, item 4, seventh session). For each batch: a generate's warm-up, then
``DecodeState.prefill`` alone timed (median of ``--repeats``, synchronized), then one prefill
under torch.profiler: its wall, the device's busy time, and the operators by host time
(self CPU) and by device time, so the host's share shows.

``--device cpu --tiny`` only checks this script (timings mean nothing).
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

from hpcrl.config.recipe import GenerationCfg  # noqa: E402
from hpcrl.core.generation.torch_engine import TorchEngine  # noqa: E402
from hpcrl.core.models.tiny import TINY_SPECS, tiny_config  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the 'llama' tiny spec (CPU check)")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--prompt-min", type=int, default=20)
    parser.add_argument("--prompt-max", type=int, default=60)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    return args


def build_engine(args: argparse.Namespace) -> TorchEngine:
    from transformers import AutoModelForCausalLM

    spec = TINY_SPECS["llama" if args.tiny else "llama-1b"]
    config = tiny_config(spec, spec.vocab_size or 128)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config.eos_token_id = None
    return TorchEngine.from_hf_model(
        model.eval(), max_model_len=args.prompt_max + args.new_tokens
    )  # fmt: skip


def prompts_for(rows: int, args: argparse.Namespace, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(rows)
    lengths = torch.randint(args.prompt_min, args.prompt_max + 1, (rows,), generator=gen)
    ordered = sorted(lengths.tolist(), reverse=True)  # the engine's waves: longest first
    return [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in ordered]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_prefill(engine: TorchEngine, prompts: list[list[int]], args: argparse.Namespace):
    from torch.profiler import ProfilerActivity, profile

    state = engine._state
    assert state is not None
    prefill = lambda: state.prefill(prompts, len(prompts[0]), 16384)  # noqa: E731
    samples = []
    for _ in range(args.repeats):
        synchronize(args.device)
        started = time.perf_counter()
        prefill()
        synchronize(args.device)
        samples.append(time.perf_counter() - started)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    synchronize(args.device)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        prefill()
        synchronize(args.device)
        wall_s = time.perf_counter() - started
    return statistics.median(samples), wall_s, prof


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = build_engine(args)
    vocab = engine.decoder.shape.vocab
    cfg = GenerationCfg(temperature=1.0, max_new_tokens=args.new_tokens)
    for rows in args.batches:
        prompts = prompts_for(rows, args, vocab)
        for _ in range(2):
            engine.generate(prompts, cfg, 0)
        median_s, wall_s, prof = profile_prefill(engine, prompts, args)
        events = prof.key_averages()
        device_us = sum(
            e.self_device_time_total for e in events if e.device_type.name == "CUDA"
        )  # fmt: skip
        host_us = sum(e.self_cpu_time_total for e in events)
        tokens = sum(map(len, prompts))
        print(f"\nbatch {rows}: {tokens} prompt tokens; prefill median {1e3 * median_s:.1f} ms "
              f"({args.repeats} calls); profiled call {1e3 * wall_s:.1f} ms, device busy "
              f"{device_us / 1e3:.1f} ms, host ops {host_us / 1e3:.1f} ms", flush=True)  # fmt: skip
        for key in ("self_cpu_time_total", "device_time_total"):
            print(f"-- operators by {key}")
            print(events.table(sort_by=key, row_limit=args.top, max_name_column_width=60))
        print_python_profile(engine, prompts, args)
    return 0


def print_python_profile(engine: TorchEngine, prompts: list[list[int]], args) -> None:
    """The Python functions of one prefill by their own time (cProfile): host work that is
    not an operator (guards of compiled pieces, launchers, list building)."""
    import cProfile
    import pstats

    state = engine._state
    assert state is not None
    synchronize(args.device)
    profiler = cProfile.Profile()
    profiler.enable()
    state.prefill(prompts, len(prompts[0]), 16384)
    synchronize(args.device)
    profiler.disable()
    print("-- Python functions by own time (one prefill, cProfile)")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    sys.exit(main())
