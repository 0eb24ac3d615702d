"""Where the GPU waited for the host, from a profiler's Chrome trace.

    python3 benchmarks/launch_lag.py train-backend.trace.json.gz [--top 15]

Reads a trace that ``hpcrl.core.profiling.profiled(..., trace_path=...)`` wrote (e.g.
``benchmarks/train_throughput.py --profile-dir DIR --trace-loops backend``). Each kernel,
copy or fill is matched to the host call that queued it (their ``correlation`` id). An idle
stretch of the device before some work is *host-late* when that work was queued only after
the device had gone idle: the host, not a dependency, kept the device waiting. Host-late
time is summed by the host operation that was running on the launching thread when the work
was queued (the outermost one, and the innermost one), so the slow host code is named.

Also printed: the lag from queueing to start (how far ahead of the device the host ran),
by quartile. The host runs under the profiler's operator recording here, somewhat slower
than without it: read the names, not the exact milliseconds.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CALL_CATEGORIES = {"cuda_runtime", "cuda_driver"}
GAP_FLOOR_US = 5.0


def load_events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        trace = json.load(handle)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def host_late_report(events: Sequence[dict[str, Any]], top: int = 15) -> list[str]:
    """The report's lines (see the module docstring)."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    device = sorted(
        (e for e in complete if e.get("cat") in DEVICE_CATEGORIES), key=lambda e: e["ts"]
    )
    launches = {
        e["args"]["correlation"]: e
        for e in complete
        if e.get("cat") in HOST_CALL_CATEGORIES and "correlation" in e.get("args", {})
    }
    ops_by_thread = _ops_by_thread(complete)
    if not device:
        return ["no device work in the trace"]
    lags, outer_ms, inner_ms = [], {}, {}
    idle_us = late_us = 0.0
    busy_until = device[0]["ts"] + device[0]["dur"]
    for work in device[1:]:
        launch = launches.get(work.get("args", {}).get("correlation"))
        if launch is not None:
            lags.append(work["ts"] - launch["ts"])
        gap_us = work["ts"] - busy_until
        if gap_us >= GAP_FLOOR_US:
            idle_us += gap_us
            if launch is not None and launch["ts"] > busy_until:
                late_us += gap_us
                outer, inner = _enclosing(ops_by_thread.get(launch["tid"], []), launch["ts"])
                outer_ms[outer] = outer_ms.get(outer, 0.0) + gap_us / 1e3
                inner_ms[inner] = inner_ms.get(inner, 0.0) + gap_us / 1e3
        busy_until = max(busy_until, work["ts"] + work["dur"])
    span_us = busy_until - device[0]["ts"]
    lines = [
        f"device span {span_us / 1e3:.1f} ms; idle >= {GAP_FLOOR_US:.0f} us: {idle_us / 1e3:.2f} ms, "
        f"of which host-late (queued after the device went idle) {late_us / 1e3:.2f} ms",
    ]
    if lags:
        q = statistics.quantiles(lags, n=4) if len(lags) > 1 else [lags[0]] * 3
        lines.append(
            f"queued -> started, us: quartiles {q[0]:.0f} / {q[1]:.0f} / {q[2]:.0f} "
            f"over {len(lags)} launches (small: the host barely ahead)"
        )
    for title, table in (("outermost", outer_ms), ("innermost", inner_ms)):
        lines.append(f"host-late ms by the {title} host operation at the launch:")
        for name, ms in sorted(table.items(), key=lambda item: -item[1])[:top]:
            lines.append(f"{ms:8.3f}  {name[:100]}")
    return lines


def _ops_by_thread(complete: Sequence[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for event in complete:
        if event.get("cat") in ("cpu_op", "user_annotation", "python_function"):
            by_thread.setdefault(event["tid"], []).append(event)
    for ops in by_thread.values():
        ops.sort(key=lambda e: e["ts"])
    return by_thread


def _enclosing(ops: Sequence[dict[str, Any]], at_us: float) -> tuple[str, str]:
    """The outermost and innermost host operations running at ``at_us``."""
    starts = [op["ts"] for op in ops]
    running = [
        op for op in ops[: bisect.bisect_right(starts, at_us)] if op["ts"] + op["dur"] >= at_us
    ]
    if not running:
        return "(no recorded operation)", "(no recorded operation)"
    outer = min(running, key=lambda op: (op["ts"], -op["dur"]))
    inner = max(running, key=lambda op: (op["ts"], -op["dur"]))
    return outer["name"], inner["name"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    print("\n".join(host_late_report(load_events(args.trace), args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
