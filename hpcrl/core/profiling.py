"""A readable torch.profiler summary: where the device time of a region goes.

For performance work on a lent GPU (benchmarks/, and a job's passes under
``HPCRL_PROFILE_PASSES``, ``hpcrl.core.backends.pass_stats``): the region's wall time, the
device's busy time (kernels and copies, summed) and so its idle share, then the kernels
that took the most device time (calls, total, share of busy time) and the operators by
device time. Text, so that a device call brings it back in a few kilobytes.

``profiled(..., host_ops=False)`` records the device alone: the host then runs at nearly its
unprofiled speed, so the idle gaps between kernels (``idle_gaps``: where the device waited
for the host, with the kernels on either side) are the ones a plain run has. GPU-side
ranges such as ``Optimizer.step#...`` are annotations, not work: they count in no total.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOP_KERNELS = 25
TOP_OPERATORS = 20
TOP_GAPS = 15
GAP_FLOOR_US = 5.0  # shorter idle stretches are launch-to-launch spacing, not waits


@contextlib.contextmanager
def profiled(
    out_path: Path | str,
    title: str,
    *,
    host_ops: bool = True,
    trace_path: Path | None = None,
    python_frames: bool = False,
) -> Iterator[None]:
    """Profile the body (CPU and CUDA activity; without ``host_ops`` the device's alone) and
    write ``summary`` to ``out_path``; with ``trace_path`` also the whole timeline, a gzipped
    Chrome trace (``benchmarks/launch_lag.py`` reads it: where the host fell behind).
    ``python_frames``: the trace also holds the Python calls (``with_stack``), which names host
    time spent between operators, at the price of a slower host while profiling."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] if host_ops or not cuda else []
    if cuda:
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    started = time.perf_counter()
    with profile(activities=activities, with_stack=python_frames) as prof:
        yield
        if cuda:
            torch.cuda.synchronize()
    wall_s = time.perf_counter() - started
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary(prof, wall_s, title))
    if trace_path is not None:
        _write_trace(prof, Path(trace_path))


def _write_trace(prof: Any, trace_path: Path) -> None:
    import gzip
    import shutil
    import tempfile

    trace_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as raw:
        prof.export_chrome_trace(raw.name)
        with open(raw.name, "rb") as source, gzip.open(trace_path, "wb") as target:
            shutil.copyfileobj(source, target)


def summary(prof: Any, wall_s: float, title: str) -> str:
    """The text ``profiled`` writes."""
    kernels: dict[str, list[float]] = {}
    spans: list[tuple[float, float, str]] = []
    for event in prof.events():
        if not _on_device(event):
            continue
        us = float(event.time_range.elapsed_us())
        calls_and_us = kernels.setdefault(event.name, [0.0, 0.0])
        calls_and_us[0] += 1
        calls_and_us[1] += us
        spans.append((float(event.time_range.start), float(event.time_range.end), event.name))
    busy_us = sum(us for _, us in kernels.values())
    lines = [
        f"== {title}",
        f"wall {wall_s * 1e3:.1f} ms; device busy {busy_us / 1e3:.1f} ms "
        f"({busy_us / 1e4 / max(wall_s, 1e-9):.1f}% of wall); "
        f"{int(sum(c for c, _ in kernels.values()))} kernels/copies",
        f"top {TOP_KERNELS} device kernels by total time:",
        f"{'total ms':>9} {'share':>6} {'calls':>6} {'us/call':>8}  name",
    ]
    ranked = sorted(kernels.items(), key=lambda item: -item[1][1])
    for name, (calls, us) in ranked[:TOP_KERNELS]:
        lines.append(
            f"{us / 1e3:9.2f} {100 * us / max(busy_us, 1e-9):5.1f}% {int(calls):6d} "
            f"{us / calls:8.1f}  {name[:110]}"
        )
    lines.extend(idle_gaps(spans))
    lines.append("operators by device time (self CPU time shows host cost):")
    try:
        table = prof.key_averages().table(
            sort_by="device_time_total", row_limit=TOP_OPERATORS, max_name_column_width=60
        )
    except Exception as error:  # an older/newer profiler without that sort key
        table = f"(no operator table: {type(error).__name__}: {error})"
    lines.append(table)
    return "\n".join(lines) + "\n"


def idle_gaps(spans: list[tuple[float, float, str]]) -> list[str]:
    """Lines on where the device sat idle between its first and last kernel: ``spans`` are
    (start us, end us, name) of kernels and copies, in any order, possibly overlapping
    (several streams). Each gap is named by the work that ended before it and the work that
    began after it, with its offset from the first kernel."""
    if not spans:
        return ["idle gaps: no device work recorded"]
    ordered = sorted(spans)
    first_us = ordered[0][0]
    covered_until_us, last_name = ordered[0][1], ordered[0][2]
    gaps: list[tuple[float, float, str, str]] = []  # (length, offset, before, after)
    for start_us, end_us, name in ordered[1:]:
        if start_us - covered_until_us >= GAP_FLOOR_US:
            gaps.append((start_us - covered_until_us, covered_until_us - first_us, last_name, name))
        if end_us > covered_until_us:
            covered_until_us, last_name = end_us, name
    span_us = covered_until_us - first_us
    idle_us = sum(length for length, *_ in gaps)
    lines = [
        f"idle gaps >= {GAP_FLOOR_US:.0f} us: {len(gaps)}, {idle_us / 1e3:.2f} ms of the "
        f"{span_us / 1e3:.1f} ms from the first kernel to the last "
        f"({100 * idle_us / max(span_us, 1e-9):.1f}%); the longest:",
        f"{'gap ms':>8} {'at ms':>8}  after -> before",
    ]
    for length, offset, before, after in sorted(gaps, reverse=True)[:TOP_GAPS]:
        lines.append(f"{length / 1e3:8.3f} {offset / 1e3:8.2f}  {before[:55]} -> {after[:55]}")
    # Many short gaps add up: summed by the work that waited for the host after them.
    by_next: dict[str, list[float]] = {}
    for length, _, _, after in gaps:
        count_and_us = by_next.setdefault(after[:70], [0.0, 0.0])
        count_and_us[0] += 1
        count_and_us[1] += length
    lines.append("idle gaps summed by the work after them:")
    lines.append(f"{'gaps ms':>8} {'gaps':>5}  work after")
    for name, (count, us) in sorted(by_next.items(), key=lambda item: -item[1][1])[:TOP_GAPS]:
        lines.append(f"{us / 1e3:8.3f} {int(count):5d}  {name}")
    return lines


def _on_device(event: Any) -> bool:
    """A kernel, copy or fill on the GPU (not a GPU-side annotation of a host range)."""
    device_type = getattr(event, "device_type", None)
    # Annotations carry a '#' (``Optimizer.step#AdamW.step``); kernel names never do.
    if getattr(event, "is_user_annotation", False) or "#" in event.name:
        return False
    return device_type is not None and "CUDA" in str(device_type)
