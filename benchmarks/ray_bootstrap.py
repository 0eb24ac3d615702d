"""Benchmark: time from job start to "all Ray nodes joined", hpcrl's bootstrap vs a plain script.

Runs on the 2-node test Slurm cluster (``bash tests/slurm/cluster.sh start``). Alternates
submissions of ``ray_bootstrap_hpcrl.sbatch`` (one task per node running hpcrl.job.node) and
``ray_bootstrap_baseline.sbatch`` (``ray start`` in background steps, a fixed sleep, ``ray status``
polled every 5 s), so machine load hits both alike. Both scripts record the batch script's start
time; "ready" is when all nodes had joined (hpcrl: ``status/ray_ready``; baseline: the poll
that saw both), "end" is when the batch script finished (Ray stopped on both nodes).

    .venv/bin/python benchmarks/ray_bootstrap.py --runs 5
"""

from __future__ import annotations

import argparse
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


def submit_and_wait(kind: str, out_dir: Path, python: str) -> dict[str, float] | str:
    """Run one job; seconds from batch start to ready and to end, or why it failed."""
    out_dir.mkdir(parents=True)
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
    try:
        start, ready, end = (
            float((out_dir / name).read_text()) for name in ("batch_start", "ready", "batch_end")
        )
    except FileNotFoundError as error:
        return f"job {job_id} did not finish cleanly ({error.filename} missing; see {out_dir})"
    return {"ready_s": ready - start, "end_s": end - start}


def summarize(times: list[float]) -> str:
    if not times:
        return "-"
    return f"{statistics.median(times):6.1f}  ({min(times):.1f}–{max(times):.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="jobs per variant")
    parser.add_argument("--python", default=sys.executable, help="python with hpcrl and ray")
    parser.add_argument("--keep", action="store_true", help="keep the jobs' output folders")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in SCRIPTS}
    failures: dict[str, list[str]] = {kind: [] for kind in SCRIPTS}
    scratch = Path(tempfile.mkdtemp(prefix="bench-ray-", dir="/tmp"))
    for run in range(args.runs):
        order = list(SCRIPTS) if run % 2 == 0 else list(reversed(SCRIPTS))
        for kind in order:
            timing = submit_and_wait(kind, scratch / f"{kind}-{run}", args.python)
            if isinstance(timing, str):
                failures[kind].append(timing)
                print(f"run {run} {kind:8s} FAILED: {timing}", flush=True)
                continue
            results[kind].append(timing)
            print(f"run {run} {kind:8s} ready {timing['ready_s']:5.1f}s  end {timing['end_s']:5.1f}s",
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    print(f"\nmedian (min–max) over successful jobs, seconds from batch start; {args.runs} each:")
    print(f"{'':10s} {'all nodes joined':>22s} {'job end (Ray stopped)':>24s} {'failed':>7s}")
    for kind, timings in results.items():
        ready = summarize([t["ready_s"] for t in timings])
        end = summarize([t["end_s"] for t in timings])
        print(f"{kind:10s} {ready:>22s} {end:>24s} {len(failures[kind]):>7d}")
    if results["hpcrl"] and results["baseline"]:
        for metric in ("ready_s", "end_s"):
            hpcrl = statistics.median(t[metric] for t in results["hpcrl"])
            baseline = statistics.median(t[metric] for t in results["baseline"])
            print(f"ratio baseline/hpcrl ({metric[:-2]}): {baseline / hpcrl:.2f}x")
    if args.keep or any(failures.values()):
        print(f"job folders kept in {scratch}")
    else:
        shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
