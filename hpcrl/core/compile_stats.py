"""torch.compile's figures in this process: how many graphs it built and how its caches
answered (``hpcrl.plan.compile_cache`` points them at a folder runs share).

A run whose first step recompiles everything shows only misses; a run that found the
previous run's work shows hits. Reported per rank through the workers' ``collect_state``
and written into every metrics.jsonl line (``hpcrl.core.metrics.step_memory_metrics``), so a slow first step
can be told apart: compiling (misses), tracing only (hits), or something else, by
``compile_time_s``: the seconds torch.compile has taken in this process so far (dynamo's
tracing, cache lookups and loads, Inductor's compilation of what missed, and the backward
graphs compiled lazily at their first backward).
"""

from __future__ import annotations

import sys

#: metrics key -> (torch counter group, counter names added up). Inductor's FX graph cache
#: holds the generated code, AOTAutograd's the forward/backward split above it.
_CACHE_COUNTERS = {
    "compile_cache_hits": (("inductor", "fxgraph_cache_hit"), ("aot_autograd", "autograd_cache_hit")),
    "compile_cache_misses": (("inductor", "fxgraph_cache_miss"), ("aot_autograd", "autograd_cache_miss")),
    "compile_cache_bypasses": (("inductor", "fxgraph_cache_bypass"), ("aot_autograd", "autograd_cache_bypass")),
}  # fmt: skip
#: dynamo's timers (``torch._dynamo.utils.compilation_time_metrics``) that add up to the
#: compile time: a frame's whole compilation, and a backward compiled at its first call.
_COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def compiled_graph_count() -> int:
    """Graphs torch.compile has built in this process so far (recompilations included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_cache_counts() -> dict[str, float]:
    """{compile_cache_hits, _misses, _bypasses, compile_time_s} so far in this process; empty
    when torch.compile was never loaded here (nothing is imported for the answer)."""
    if "torch._dynamo.utils" not in sys.modules:
        return {}
    from torch._dynamo.utils import compilation_time_metrics, counters

    counts: dict[str, float] = {
        key: sum(int(counters[group][name]) for group, name in parts)
        for key, parts in _CACHE_COUNTERS.items()
    }
    seconds = sum(sum(compilation_time_metrics.get(name, ())) for name in _COMPILE_TIMERS)
    counts["compile_time_s"] = round(seconds, 3)
    counts.update(ahead_of_time_counts())
    return counts


def ahead_of_time_counts() -> dict[str, float]:
    """{aot_loads, aot_builds, aot_guard_rejections}: the compilations kept ahead of time
    (``hpcrl.core.generation.aot_precompiled``) that this process loaded, built, and whose
    guards refused the kind of call they were kept for (the reason is in the worker's log).
    Their loads are no cache hits of Inductor's: a warm run shows 0 hits and N loads.
    Empty when that module was never imported here."""
    module = sys.modules.get("hpcrl.core.generation.aot_precompiled")
    if module is None:
        return {}
    return {key: float(value) for key, value in module.TALLY.items()}
