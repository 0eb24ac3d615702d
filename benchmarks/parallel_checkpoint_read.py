"""Benchmark: cold torch_dist (DCP) checkpoint load, PyTorch's reader vs hpcrl's parallel reader.

One command does everything: writes a single-rank DCP checkpoint of ``--size-gb`` (one file,
like one rank's shard; ``--item-mb`` tensors, int32 with a per-tensor pattern), then loads it
into preallocated tensors with 1 thread (PyTorch's own ``FileSystemReader.read_data``) and
with 2/4/8/16 threads (``parallel_read.parallel_reads``), ``--repeats`` times, interleaved,
checking every loaded tensor bit for bit. Before every load the page cache of the checkpoint
is dropped: each file is fsync'ed and ``posix_fadvise(DONTNEED)``'ed (works unprivileged);
when ``/proc/sys/vm/drop_caches`` is writable (root) it is used as well, and the output says
which. Also printed: the raw disk ceiling (the same bytes read cold with plain ``os.pread``
on 1 and on the most threads, no torch) and each reader's peak extra host RSS.

    python benchmarks/parallel_checkpoint_read.py --size-gb 4 --dir /tmp

``--warm`` adds warm-cache loads. Runtime at 4 GiB on the H200 machine: about 1–2 minutes.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DROP_CACHES = "/proc/sys/vm/drop_caches"
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=4.0)
    parser.add_argument("--item-mb", type=float, default=256.0, help="size of each tensor")
    parser.add_argument("--threads", default="1,2,4,8,16", help="first entry is the baseline")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--range-mb", type=float, default=16.0, help="parallel reader range size")
    parser.add_argument(
        "--inflight-mb", type=float, default=1024.0, help="parallel reader in-flight item budget"
    )
    parser.add_argument("--warm", action="store_true", help="also time warm-cache loads")
    parser.add_argument("--dir", default=None, help="where to write the checkpoint (default: tmp)")
    return parser.parse_args()


def drop_cache(files: list[Path], use_drop_caches: bool) -> None:
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if use_drop_caches:
        with open(DROP_CACHES, "w") as control:
            control.write("1\n")


def drop_caches_writable() -> bool:
    try:
        with open(DROP_CACHES, "w") as control:
            control.write("1\n")
        return True
    except OSError:
        return False


def expected(index: int, numel: int):
    import torch

    return torch.arange(numel, dtype=torch.int32).add_(index * 7919)


def write_checkpoint(folder: str, count: int, numel: int) -> list[Path]:
    import torch.distributed.checkpoint as dcp

    state = {f"t{i:04d}": expected(i, numel) for i in range(count)}
    dcp.save(state, checkpoint_id=folder, no_dist=True)
    return sorted(Path(folder).glob("*.distcp"))


class PeakRss:
    """Samples this process's RSS every 5 ms while active; ``extra_mib`` over the start."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._start = self._peak = self._rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self._peak = max(self._peak, self._rss())

    def extra_mib(self) -> float:
        self._stop.set()
        self._thread.join()
        return (max(self._peak, self._rss()) - self._start) / 2**20


def timed_load(folder: str, target: dict, threads: int, args) -> tuple[float, float]:
    import torch.distributed.checkpoint as dcp

    from hpcrl.core.backends.megatron.parallel_read import parallel_reads

    for tensor in target.values():
        tensor.zero_()  # a load that silently skips items must fail the check below
    rss = PeakRss()
    started = time.perf_counter()
    with parallel_reads(
        threads,
        range_bytes=int(args.range_mb * 2**20),
        max_inflight_bytes=int(args.inflight_mb * 2**20),
    ):
        dcp.load(target, checkpoint_id=folder, no_dist=True)
    seconds = time.perf_counter() - started
    extra = rss.extra_mib()
    numel = next(iter(target.values())).numel()
    for index, key in enumerate(sorted(target)):
        assert target[key].equal(expected(index, numel)), f"{threads} threads: {key} differs"
    return seconds, extra


def _read_range(fd: int, buffer: memoryview, length: int, chunk_bytes: int, start: int) -> int:
    return os.preadv(fd, [buffer[start : min(start + chunk_bytes, length)]], start)


def raw_read_s(files: list[Path], threads: int, chunk_bytes: int = 16 << 20) -> float:
    """Read every byte with os.preadv on ``threads`` threads into one buffer (disk ceiling)."""
    size = max(file.stat().st_size for file in files)
    buffer = memoryview(bytearray(size))
    started = time.perf_counter()
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        length = file.stat().st_size
        read = functools.partial(_read_range, fd, buffer, length, chunk_bytes)
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(read, range(0, length, chunk_bytes)))
        os.close(fd)
    return time.perf_counter() - started


def measure(args, folder: str, files: list[Path], target: dict, use_drop_caches: bool) -> dict:
    thread_counts = [int(t) for t in args.threads.split(",")]
    modes = ["cold", "warm"] if args.warm else ["cold"]
    times = {(mode, t): [] for mode in modes for t in thread_counts}
    rss = {t: 0.0 for t in thread_counts}
    for _ in range(args.repeats):
        for threads in thread_counts:
            for mode in modes:
                if mode == "cold":
                    drop_cache(files, use_drop_caches)
                seconds, extra = timed_load(folder, target, threads, args)
                times[(mode, threads)].append(seconds)
                rss[threads] = max(rss[threads], extra)
    raw = {}
    for threads in sorted({1, max(thread_counts)}):
        drop_cache(files, use_drop_caches)
        raw[threads] = raw_read_s(files, threads)
    return {"times": times, "rss": rss, "raw": raw, "modes": modes, "threads": thread_counts}


def report(args, results: dict, total_bytes: int, files: list[Path], use_drop_caches: bool) -> None:
    import torch

    gib = total_bytes / 2**30
    how = "posix_fadvise DONTNEED" + (" + drop_caches" if use_drop_caches else "")
    print(
        f"{gib:.2f} GiB in {len(files)} file(s), items {args.item_mb:g} MiB, ranges "
        f"{args.range_mb:g} MiB, in-flight budget {args.inflight_mb:g} MiB, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, median of {args.repeats}; cold = {how} before each load "
        f"(/proc/sys/vm/drop_caches writable: {'yes' if use_drop_caches else 'no'})"
    )
    raw = "; ".join(f"{t} thread(s) {gib / s:.2f} GiB/s" for t, s in results["raw"].items())
    print(f"raw disk ceiling (cold os.pread, no torch): {raw}")
    header = "".join(f" {m + ' s':>8} {'×':>6} {'GiB/s':>6}" for m in results["modes"])
    print(f"{'threads':>16}{header} {'peak extra RSS MiB':>19}")
    base_threads = results["threads"][0]
    for threads in results["threads"]:
        label = f"{threads} (PyTorch)" if threads == 1 else str(threads)
        row = f"{label:>16}"
        for mode in results["modes"]:
            median_s = statistics.median(results["times"][(mode, threads)])
            base_s = statistics.median(results["times"][(mode, base_threads)])
            row += f" {median_s:>8.2f} {base_s / median_s:>5.2f}× {gib / median_s:>6.2f}"
        print(f"{row} {results['rss'][threads]:>19.0f}")


def main() -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    args = parse_args()
    numel = int(args.item_mb * 2**20 / 4)
    count = max(1, round(args.size_gb * 2**30 / (numel * 4)))
    folder = tempfile.mkdtemp(prefix="hpcrl-ckpt-read-", dir=args.dir)
    try:
        files = write_checkpoint(folder, count, numel)
        target = {f"t{i:04d}": torch.empty(numel, dtype=torch.int32) for i in range(count)}
        use_drop_caches = drop_caches_writable()
        results = measure(args, folder, files, target, use_drop_caches)
        report(args, results, count * numel * 4, files, use_drop_caches)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
