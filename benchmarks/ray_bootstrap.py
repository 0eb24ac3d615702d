"""Benchmark: time from job start to "all Ray nodes joined", hpcrl's bootstrap vs a plain script.

Runs on the 2-node test Slurm cluster (``bash tests/slurm/cluster.sh start``). Alternates
submissions of ``ray_bootstrap_hpcrl.sbatch`` (one task per node running hpcrl.job.node) and
``ray_bootstrap_baseline.sbatch`` (a minimal hand-written script made as fast as hpcrl where
hpcrl has no design advantage: both ``ray start`` steps launched together, the worker polling
the head's port every 0.1 s, no fixed sleep), so machine load hits both alike. Both scripts
record the batch script's start time and the same "ready" event: the GCS node table lists
every node alive, polled every 0.2 s on both sides (hpcrl: ``status/ray_ready``, read without
connecting a driver; baseline: ``ray.init`` + ``ray.nodes()``, Ray's public API). "end" is
when the batch script finished (Ray stopped on both nodes). What remains different is design:
hpcrl starts the worker's Ray only once the head's raylet registered and does not connect a
driver (whose Python worker the head would start) before every node is there.

    .venv/bin/python benchmarks/ray_bootstrap.py --runs 5
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
SCRIPTS = {
    "hpcrl": HERE / "ray_bootstrap_hpcrl.sbatch",
    "baseline": HERE / "ray_bootstrap_baseline.sbatch",
}
JOB_TIMEOUT_S = 180


def write_plan(out_dir: Path) -> None:
    """The job's plan, as `hpcrl submit` leaves it: the shipped 2-node CPU recipe on the
    test cluster's profile (the node entrypoint reads its node count and ports from it)."""
    from hpcrl.config import load_profile, load_recipe
    from hpcrl.plan.planner import plan
    from hpcrl.run.jobspec_file import write_jobspec

    recipe = load_recipe("grpo-tiny-2n-cpu").recipe
    spec = plan(recipe, load_profile("slurm-test"), run_dir=str(out_dir.absolute()),
                recipe_source="grpo-tiny-2n-cpu", profile_source="slurm-test")  # fmt: skip
    write_jobspec(spec)


def submit_and_wait(kind: str, out_dir: Path, python: str) -> dict[str, float] | str:
    """Run one job; seconds from batch start to ready and to end, or why it failed."""
    out_dir.mkdir(parents=True)
    if kind == "hpcrl":
        write_plan(out_dir)
    job_id = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={REPO_ROOT}", f"--output={out_dir}/slurm-%j.out",
         str(SCRIPTS[kind]), str(out_dir), python],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while subprocess.run(
        ["squeue", "-h", "-j", job_id], capture_output=True, text=True
    ).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            return f"job {job_id} still running after {JOB_TIMEOUT_S}s (cancelled)"
        time.sleep(0.3)
    return read_timing(kind, out_dir) or f"job {job_id} did not finish cleanly (see {out_dir})"


def ray_runtime_started(log_path: Path) -> float | None:
    """When ``ray start`` logged "Ray runtime started." (its raylet had registered)."""
    for line in log_path.read_text(errors="replace").splitlines():
        if "Ray runtime started" in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()  # Ray logs local time, as does this machine's clock
    return None


def read_timing(kind: str, out_dir: Path) -> dict[str, float] | None:
    """Seconds from batch start: all joined, job end, and Ray's own start on the last node."""
    try:
        start, ready, end = (
            float((out_dir / name).read_text()) for name in ("batch_start", "ready", "batch_end")
        )
    except FileNotFoundError:
        return None
    ray_logs = sorted(out_dir.glob("logs/node*/attempt0/ray.out")) if kind == "hpcrl" else [
        out_dir / "head.log", out_dir / "worker.log"
    ]  # fmt: skip
    started = [ray_runtime_started(path) for path in ray_logs]
    ray_up = max(started) - start if started and None not in started else float("nan")
    return {"ready_s": ready - start, "end_s": end - start, "ray_up_s": ray_up}


def summarize(times: list[float]) -> str:
    times = [t for t in times if t == t]  # drop NaN (a log line not found)
    if not times:
        return "-"
    return f"{statistics.median(times):5.1f} ({min(times):.1f}–{max(times):.1f})"


def print_table(results: dict[str, list[dict[str, float]]], failures: dict[str, int]) -> None:
    print("\nmedian (min–max) over successful jobs, seconds from the batch script's start:")
    columns = ("Ray up on both", "all nodes joined", "joined − Ray up", "job end")
    print(f"{'':9s}" + "".join(f"{c:>21s}" for c in columns) + f"{'failed':>8s}")
    for kind, timings in results.items():
        cells = [
            summarize([t["ray_up_s"] for t in timings]),
            summarize([t["ready_s"] for t in timings]),
            summarize([t["ready_s"] - t["ray_up_s"] for t in timings]),
            summarize([t["end_s"] for t in timings]),
        ]
        print(f"{kind:9s}" + "".join(f"{c:>21s}" for c in cells) + f"{failures[kind]:>8d}")
    if results["hpcrl"] and results["baseline"]:
        for metric in ("ready_s", "end_s"):
            hpcrl = statistics.median(t[metric] for t in results["hpcrl"])
            baseline = statistics.median(t[metric] for t in results["baseline"])
            print(f"ratio baseline/hpcrl ({metric[:-2]}): {baseline / hpcrl:.2f}x")


def analyze(scratch: Path) -> None:
    """Summarize the job folders of an earlier run (kept with --keep)."""
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in SCRIPTS}
    failures = dict.fromkeys(SCRIPTS, 0)
    for out_dir in sorted(scratch.iterdir()):
        kind = out_dir.name.split("-")[0]
        timing = read_timing(kind, out_dir)
        if timing is None:
            failures[kind] += 1
        else:
            results[kind].append(timing)
    print_table(results, failures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="jobs per variant")
    parser.add_argument("--python", default=sys.executable, help="python with hpcrl and ray")
    parser.add_argument("--keep", action="store_true", help="keep the jobs' output folders")
    parser.add_argument("--analyze", type=Path, help="only summarize a kept folder of jobs")
    args = parser.parse_args()
    if args.analyze:
        analyze(args.analyze)
        return 0
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in SCRIPTS}
    failures = dict.fromkeys(SCRIPTS, 0)
    scratch = Path(tempfile.mkdtemp(prefix="bench-ray-", dir="/tmp"))
    for run in range(args.runs):
        order = list(SCRIPTS) if run % 2 == 0 else list(reversed(SCRIPTS))
        for kind in order:
            timing = submit_and_wait(kind, scratch / f"{kind}-{run}", args.python)
            if isinstance(timing, str):
                failures[kind] += 1
                print(f"run {run} {kind:8s} FAILED: {timing}", flush=True)
                continue
            results[kind].append(timing)
            print(f"run {run} {kind:8s} ready {timing['ready_s']:5.1f}s  end {timing['end_s']:5.1f}s",
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    print_table(results, failures)
    if args.keep or any(failures.values()):
        print(f"job folders kept in {scratch}")
    else:
        shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
