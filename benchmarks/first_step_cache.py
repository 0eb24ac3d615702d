"""Benchmark: the first GRPO step of a run that finds the previous run's compile cache.

Two ``hpcrl submit --wait`` of the same shipped recipe on the same machine, into one runs
folder, so both plan the same compile cache (``<runs>/.hpcrl-cache/torch-compile``,
hpcrl.plan.compile_cache): run 1 starts cold (a fresh runs folder), run 2 warm. Printed per
run from its ``metrics.jsonl``: step 1's time and phases (generate, log-probs, train), the
compile cache's hits/misses/bypasses after step 1 (``hpcrl.core.compile_stats``), the
steady median (steps from 3 on) and first / steady; then the goal of issue 25: run 2's
first step ≤ 3× its steady median.

    python benchmarks/first_step_cache.py                   # the 1-GPU recipe, local-gpu
    python benchmarks/first_step_cache.py --steps 6 --out-dir /tmp/first-step
    python benchmarks/first_step_cache.py --tiny            # CPU smoke: nothing compiles

The checkout's hpcrl is the one measured (put first on PYTHONPATH; the job inherits it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
GOAL_FIRST_OVER_STEADY = 3.0
STEADY_FROM_STEP = 3
PHASES = ("time_generate_s", "time_logprobs_s", "time_train_s")
CACHE_KEYS = (
    "compile_cache_hits",
    "compile_cache_misses",
    "compile_cache_bypasses",
    "compile_time_s",
    "aot_loads",  # the blocks' and engine pieces' kept compilations (aot_precompiled)
    "aot_builds",
    "aot_guard_rejections",  # kept ones whose guards refused their calls: the log says why
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="grpo-llama-1b-1n1g-automodel.yaml")
    parser.add_argument("--cluster", default="local-gpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out-dir", type=Path, default=None, help="runs folder (a new one)")
    parser.add_argument("--override", action="append", default=[], help="extra key=value")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke: the demo recipe")
    args = parser.parse_args(argv)
    if args.tiny:
        args.recipe, args.cluster, args.steps = "grpo-tiny-1n-cpu.yaml", "local", 3
    return args


def submit(args: argparse.Namespace, run_dir: Path, env: dict[str, str]) -> float:
    """``hpcrl submit --wait`` of the recipe into ``run_dir``; its wall seconds."""
    command = [sys.executable, "-m", "hpcrl.cli.main", "submit", args.recipe,
               "--cluster", args.cluster, "-o", str(run_dir), "--wait",
               f"grpo.max_num_steps={args.steps}", *args.override]  # fmt: skip
    print(f"$ hpcrl {' '.join(command[3:])}", flush=True)
    started = time.monotonic()
    result = subprocess.run(command, cwd=run_dir.parent, env=env, text=True, check=False)
    wall_s = time.monotonic() - started
    print(f"(exit {result.returncode}, {wall_s:.0f} s)", flush=True)
    if result.returncode != 0:
        raise SystemExit(f"the run in {run_dir} failed (exit {result.returncode})")
    return wall_s


def first_step_figures(run_dir: Path) -> dict[str, Any]:
    """Step 1 against the steady median, from the run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, filter(None, lines)) if r.get("step", 0) >= 1]
    times = [float(r["time_step_s"]) for r in steps]
    steady = times[STEADY_FROM_STEP - 1 :] or times[1:] or times
    median = statistics.median(steady)
    first = steps[0]
    return {
        "first_step_s": times[0],
        "steady_median_s": median,
        "first_over_steady": times[0] / median,
        "first_step_phases_s": {key: first.get(key) for key in PHASES},
        "every_phase_first_and_steady_s": _every_phase(steps[0], steps[len(times) - len(steady) :]),
        "after_step_1": {key: first.get(key) for key in (*CACHE_KEYS, "compiled_graphs")},
        "after_last_step": {key: steps[-1].get(key) for key in CACHE_KEYS},
        "steps": len(steps),
    }


def _every_phase(first: dict[str, Any], steady: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each ``time_*_s`` of step 1 beside its steady median: where the first step's extra
    seconds are (prefill, decode, refit, the optimizer's step, ...), from one call's runs."""
    keys = sorted(k for k, v in first.items() if k.startswith("time_") and k.endswith("_s")
                  and k != "time_step_s" and isinstance(v, int | float))  # fmt: skip
    return {
        key: [float(first[key]), statistics.median(float(r.get(key, 0.0)) for r in steady)]
        for key in keys
    }


def print_run(name: str, figures: dict[str, Any]) -> None:
    phases = "  ".join(
        f"{key.removeprefix('time_').removesuffix('_s')} {value:.2f}"
        for key, value in figures["first_step_phases_s"].items()
        if isinstance(value, int | float)
    )
    cache = {key: _count(value) for key, value in figures["after_step_1"].items()}
    print(f"{name}: first step {figures['first_step_s']:.2f} s ({phases}), steady median "
          f"{figures['steady_median_s']:.3f} s (steps {STEADY_FROM_STEP}-{figures['steps']}), "
          f"first/steady {figures['first_over_steady']:.1f}x; compile cache after step 1: "
          f"hits {cache['compile_cache_hits']}, misses {cache['compile_cache_misses']}, "
          f"bypasses {cache['compile_cache_bypasses']}, graphs {cache['compiled_graphs']}; "
          f"kept compilations: loads {cache['aot_loads']}, builds {cache['aot_builds']}, "
          f"guard rejections {cache['aot_guard_rejections']}; "
          f"torch.compile's time by then {_seconds(figures['after_step_1']['compile_time_s'])}")  # fmt: skip
    every = "  ".join(
        f"{key.removeprefix('time_').removesuffix('_s')} {first:.2f}/{steady:.2f}"
        for key, (first, steady) in figures["every_phase_first_and_steady_s"].items()
    )
    print(f"{name} phases, step 1 / steady median s: {every}")


def _seconds(value: Any) -> str:
    return "—" if value is None else f"{float(value):.2f} s"


def _count(value: Any) -> str:
    return "—" if value is None else str(int(value))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = args.out_dir or Path(tempfile.mkdtemp(prefix="hpcrl-first-step-"))
    runs.mkdir(parents=True, exist_ok=True)
    if any(runs.iterdir()):
        raise SystemExit(f"{runs} is not empty: run 1 must find no compile cache")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env.setdefault("HPCRL_CACHE", str(runs / "hpcrl-cache"))  # the tiny: model, built once
    walls, figures = [], []
    for index in (1, 2):
        run_dir = runs / f"run{index}"
        walls.append(submit(args, run_dir, env))
        figures.append(first_step_figures(run_dir))
    print(f"\n{args.recipe} on {args.cluster}, {args.steps} steps, runs folder {runs}; "
          f"compile cache {runs / '.hpcrl-cache' / 'torch-compile'}")  # fmt: skip
    for index, (run, wall_s) in enumerate(zip(figures, walls, strict=True), start=1):
        print_run(f"run {index} ({'cold' if index == 1 else 'warm'}, {wall_s:.0f} s wall)", run)
    warm = figures[1]
    ratio = warm["first_over_steady"]
    print(f"first step, run 2 / run 1: {warm['first_step_s'] / figures[0]['first_step_s']:.2f}x")
    verdict = "MET" if ratio <= GOAL_FIRST_OVER_STEADY else "NOT MET"
    print(f"GOAL second run's first step <= {GOAL_FIRST_OVER_STEADY:g}x steady median: "
          f"{ratio:.1f}x {verdict}")  # fmt: skip
    (runs / "first_step_cache.json").write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
