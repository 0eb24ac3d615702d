"""Running hpcrl on a GPU machine the way a user does, for ``tests/gpu``.

The commands run as a user runs them: ``python -m hpcrl.cli.main`` (what the ``hpcrl`` script
calls) in a folder of their own, never the repository root. On the GPU test machine hpcrl comes
from a wheel installed to a target folder on ``PYTHONPATH`` (tests/gpu/device_run.sh); from the
repository root the checkout's ``hpcrl`` would shadow it and its shipped profiles and recipes
(``importlib.resources``) would not be found.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
REQUIRE_GPU_ENV = "HPCRL_REQUIRE_GPU"
#: Where the tests put run folders and sweeps (device_run.sh tars it); default: pytest's tmp.
OUT_ENV = "HPCRL_GPU_TEST_OUT"
GPU_PROFILE = "local-gpu"


def gpu_count() -> int:
    """NVIDIA GPUs visible here, from ``nvidia-smi -L`` (no torch import, no CUDA context)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


def user_env(cache_dir: Path) -> dict[str, str]:
    """The submitting shell: no repository on PYTHONPATH, offline, one cache per test session
    (the tiny 1B model is built once and reused; the Megatron conversion's directory is the
    recipe's to say, see test_end_to_end.in_megatron_dir)."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [p for p in paths if Path(p).resolve() != REPO]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        HF_HUB_OFFLINE="1",
        HPCRL_CACHE=str(cache_dir),
        PYTHONUNBUFFERED="1",
    )
    env.pop("HPCRL_DRIVER", None)  # the real training core, never a test driver
    return env


def hpcrl(
    args: Sequence[str], cwd: Path, env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``hpcrl ARGS`` in ``cwd``; output is echoed (the device log keeps it) and returned."""
    started = time.monotonic()
    print(f"$ hpcrl {' '.join(args)}", flush=True)
    result = subprocess.run(
        [sys.executable, "-m", "hpcrl.cli.main", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    print(output_of(result), flush=True)
    print(f"(hpcrl {args[0]}: {time.monotonic() - started:.0f} s)", flush=True)
    return result


def output_of(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit code {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    assert path.is_file(), f"{path} is missing"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_step_metrics(run_dir: Path, num_steps: int) -> list[dict[str, Any]]:
    """Every step recorded, with a finite loss, a reward, peak GPU memory and host RSS, and
    the CUDA segments the workers' allocators asked for."""
    records = read_metrics(run_dir)
    assert [r.get("step") for r in records] == list(range(1, num_steps + 1)), records
    for record in records:
        where = f"{run_dir.name} step {record['step']}"
        for key in ("loss", "reward_mean", "peak_gpu_mem_gb", "peak_host_rss_gb", "time_step_s"):
            value = record.get(key)
            # the metrics writer turns NaN/inf into null: null here means not finite or missing
            assert isinstance(value, int | float) and math.isfinite(value), (
                f"{where}: {key}={value!r}"
            )
        assert record["peak_gpu_mem_gb"] > 0, f"{where}: no GPU memory recorded"
        assert record["peak_host_rss_gb"] > 0, f"{where}: no host memory recorded"
        # the workers' allocators ran on CUDA: their trips to the driver are counted
        assert record.get("gpu_segments_allocated_worker", -1) >= 0, f"{where}: no segments"
    # the first step meets every size for the first time
    assert records[0]["gpu_segments_allocated_worker"] > 0, records[0]
    return records


def job_state(run_dir: Path, cwd: Path, env: dict[str, str]) -> str:
    """The state ``hpcrl status --json RUN`` gives a run folder (the form kept for scripts:
    the human view of one run is a block of ``key  value`` lines, not a table row)."""
    result = hpcrl(["status", "--json", str(run_dir)], cwd, env, timeout_s=120)
    assert result.returncode == 0, output_of(result)
    runs = json.loads(result.stdout)
    assert len(runs) == 1, result.stdout
    return str(runs[0]["state"])


def _pids_whose(path_name: str, needle: bytes) -> list[int]:
    own = {os.getpid(), os.getppid()}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in own:
            continue
        try:
            if needle in (proc / path_name).read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def processes_of_run(run_dir: Path) -> list[str]:
    """Processes started for the run: the job's environment names its folder (HPCRL_RUN_DIR),
    and Ray, the driver and the workers inherit it; or their command line names it."""
    needle = str(run_dir).encode()
    pids = sorted(set(_pids_whose("environ", needle)) | set(_pids_whose("cmdline", needle)))
    described = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile
        described.append(f"{pid}: {cmdline[:200]}")
    return described


def gpu_processes() -> list[str]:
    """Processes holding a CUDA context, as nvidia-smi lists them."""
    result = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return [line for line in result.stdout.splitlines() if line.strip()]


def wait_until(condition: Callable[[], Any], timeout_s: float, poll_s: float = 1.0) -> Any:
    """``condition()``'s last value, once truthy or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll_s)


def assert_nothing_left(run_dir: Path) -> None:
    """No process of the run and no process on the GPU (processes may take a moment to exit)."""
    left = wait_until(lambda: not processes_of_run(run_dir), timeout_s=30)
    assert left, "processes of the run are still alive:\n" + "\n".join(processes_of_run(run_dir))
    idle = wait_until(lambda: not gpu_processes(), timeout_s=30)
    assert idle, "processes still hold the GPU:\n" + "\n".join(gpu_processes())
