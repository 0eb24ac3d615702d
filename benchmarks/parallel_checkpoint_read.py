"""Benchmark: torch_dist checkpoint load with PyTorch's reader vs hpcrl's parallel reader.

Writes one single-rank DCP checkpoint of ``--size-gb`` (fp32 tensors of 64 MiB, like the
shards of one rank), then loads it into preallocated tensors with 1 (PyTorch's
``FileSystemReader.read_data``) and 2/4/8 threads (``parallel_read.parallel_reads``),
``--repeats`` times each, interleaved, and prints medians side by side with the ratio to 1
thread. ``--cold`` drops the page cache before every load (root only:
``/proc/sys/vm/drop_caches``); otherwise the file is read warm from the page cache.

    python benchmarks/parallel_checkpoint_read.py --size-gb 2 --cold
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--threads", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each load")
    parser.add_argument(
        "--dir", default=None, help="where to write the checkpoint (default: a tmp dir)"
    )
    return parser.parse_args()


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as control:
        control.write("3\n")


def main() -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from hpcrl.core.backends.megatron.parallel_read import parallel_reads

    args = parse_args()
    numel = 16 * 2**20  # 64 MiB of fp32 per tensor
    count = max(1, int(args.size_gb * 2**30 / (numel * 4)))
    folder = tempfile.mkdtemp(dir=args.dir)
    state = {f"t{i}": torch.randn(numel) for i in range(count)}
    dcp.save(state, checkpoint_id=folder, no_dist=True)
    target = {k: torch.empty_like(v) for k, v in state.items()}
    thread_counts = [int(t) for t in args.threads.split(",")]
    times: dict[int, list[float]] = {t: [] for t in thread_counts}
    for _ in range(args.repeats):
        for threads in thread_counts:
            if args.cold:
                drop_caches()
            started = time.perf_counter()
            with parallel_reads(threads):
                dcp.load(target, checkpoint_id=folder, no_dist=True)
            times[threads].append(time.perf_counter() - started)
            assert all(torch.equal(target[k], state[k]) for k in ("t0", f"t{count - 1}"))
    base = statistics.median(times[thread_counts[0]])
    print(
        f"{count * numel * 4 / 2**30:.2f} GiB, {'cold' if args.cold else 'warm'} cache, "
        f"{os.cpu_count()} CPUs, median of {args.repeats}"
    )
    print(f"{'threads':>7} {'load s':>8} {'speed-up':>9}")
    for threads in thread_counts:
        median_s = statistics.median(times[threads])
        print(f"{threads:>7} {median_s:>8.2f} {base / median_s:>8.2f}×")


if __name__ == "__main__":
    main()
