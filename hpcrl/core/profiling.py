"""A readable torch.profiler summary: where the device time of a region goes.

For performance work on a lent GPU (benchmarks/, and a job's passes under
``HPCRL_PROFILE_PASSES``, ``hpcrl.core.backends.pass_stats``): the region's wall time, the
device's busy time (kernels and copies, summed) and so its idle share, then the kernels
that took the most device time (calls, total, share of busy time) and the operators by
device time. Text, so that a device call brings it back in a few kilobytes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOP_KERNELS = 25
TOP_OPERATORS = 20


@contextlib.contextmanager
def profiled(out_path: Path | str, title: str) -> Iterator[None]:
    """Profile the body (CPU and CUDA activity) and write ``summary`` to ``out_path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    cuda = torch.cuda.is_available()
    if cuda:
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        yield
        if cuda:
            torch.cuda.synchronize()
    wall_s = time.perf_counter() - started
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary(prof, wall_s, title))


def summary(prof: Any, wall_s: float, title: str) -> str:
    """The text ``profiled`` writes."""
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if not _on_device(event):
            continue
        us = float(event.time_range.elapsed_us())
        calls_and_us = kernels.setdefault(event.name, [0.0, 0.0])
        calls_and_us[0] += 1
        calls_and_us[1] += us
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
    lines.append("operators by device time (self CPU time shows host cost):")
    try:
        table = prof.key_averages().table(
            sort_by="device_time_total", row_limit=TOP_OPERATORS, max_name_column_width=60
        )
    except Exception as error:  # an older/newer profiler without that sort key
        table = f"(no operator table: {type(error).__name__}: {error})"
    lines.append(table)
    return "\n".join(lines) + "\n"


def _on_device(event: Any) -> bool:
    device_type = getattr(event, "device_type", None)
    return device_type is not None and "CUDA" in str(device_type)
