"""Running the ``hpcrl`` command the way a user does, for the submission tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
TWO_NODE_RECIPE = str(RECIPES / "grpo-tiny-2n-cpu.yaml")
ONE_NODE_RECIPE = str(RECIPES / "grpo-tiny-1n-cpu-megatron.yaml")
ONE_NODE_OVERRIDES = ("cluster.gpus_per_node=1",)  # slurm-test nodes have one worker slot
FRACTION_KEY = "policy.megatron_cfg.optimizer.optimizer_offload_fraction"
OFFLOAD_ON = ("policy.megatron_cfg.optimizer.optimizer_cpu_offload=true",)


def job_env(driver: str | None = None, **extra: str) -> dict[str, str]:
    """The submitting shell: the venv's python first on PATH (profiles run ``python3``; sbatch
    exports this environment to the job), the repo importable (test drivers), the driver."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    if driver is not None:
        env["HPCRL_DRIVER"] = driver
    env.update(extra)
    return env


def own_ray_ports_env(slot: int) -> dict[str, str]:
    """``HPCRL_RAY_*`` ports in a band of their own (the node entrypoint's override): local
    jobs share 127.0.0.1 with whatever else runs Ray on this machine; the profile's fixed
    ports would collide with it. Bands of 200 ports from 20000, all below the ephemeral range."""
    from hpcrl.config.profile import RayPortsCfg

    base = 20000 + 200 * slot
    names = [field.name for field in attrs.fields(RayPortsCfg)]
    singles = [name for name in names if name not in ("min_worker_port", "max_worker_port")]
    env = {f"HPCRL_RAY_{name.upper()}": str(base + index) for index, name in enumerate(singles)}
    env["HPCRL_RAY_MIN_WORKER_PORT"] = str(base + 100)
    env["HPCRL_RAY_MAX_WORKER_PORT"] = str(base + 199)
    return env


def hpcrl(
    args: Sequence[str], cwd: Path, env: dict[str, str], timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """``hpcrl ARGS`` in ``cwd``; stdout and stderr together, for assertions and failure output."""
    return subprocess.run(
        [sys.executable, "-m", "hpcrl.cli.main", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip


def output_of(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit code {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(interval_s)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


CANCELLED_LINE = re.compile(
    r"\[(?:point-\d+ )?hpcrl\] job (?P<job>\S+) was cancelled at .+?(?: by \S+ \(hpcrl cancel\))?"
    r"(?:; (?P<hidden>\d+) line\(s\) of shutdown output left out \(hpcrl logs --raw shows them\))?"
)


def logs_once_they_stop_growing(
    run: Path, cwd: Path, timeout_s: float = 30
) -> tuple[list[str], list[str]]:
    """``hpcrl logs`` and ``hpcrl logs --raw`` of one moment: processes of a cancelled job may
    still be writing their last lines (a loaded CI machine, 2026-12-05: 2 more raw lines than
    when the shown ones were read), so both are read until the raw log reads the same around
    the shown one."""
    deadline = time.monotonic() + timeout_s
    while True:
        raw_before = hpcrl(["logs", str(run), "--raw"], cwd, job_env()).stdout.splitlines()
        shown = hpcrl(["logs", str(run)], cwd, job_env()).stdout.splitlines()
        raw = hpcrl(["logs", str(run), "--raw"], cwd, job_env()).stdout.splitlines()
        if raw == raw_before or time.monotonic() > deadline:
            return shown, raw
        time.sleep(1)


def assert_cancelled_logs_end_quietly(run: Path, job_id: str, cwd: Path) -> None:
    """``hpcrl logs`` of a cancelled job ends with the one line saying so, without the
    shutdown noise that ``--raw`` still shows (issue 26 item 7)."""
    shown, raw = logs_once_they_stop_growing(run, cwd)
    match = CANCELLED_LINE.fullmatch(shown[-1]) if shown else None
    assert match is not None and match["job"] == job_id, shown[-5:]
    hidden = int(match["hidden"] or 0)
    assert len(raw) == len(shown) - 1 + hidden, (len(raw), len(shown), hidden)
    for noise in ("KeyboardInterrupt", "SIGTERM received", "CANCELLED AT", "Bypassing signal"):
        assert not any(noise in line for line in shown), noise
