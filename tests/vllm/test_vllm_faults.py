"""A fault inside a running vLLM job: the driver of the shipped vLLM CPU recipe, SIGKILLed as
the OOM killer would after a training step (the vLLM engine has generated that step's
rollouts), through ``hpcrl submit --cluster local --wait`` with the real driver. The job
fails with 137 and the named cause, and no process of it is left: not the driver, not Ray's,
not the generation worker that holds the vLLM engine.

The tiny recipe's engine runs in its generation worker's process (one rank:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, hpcrl.core.generation.vllm_engine); with tensor or
pipeline parallelism it would be an EngineCore child of that worker, a job process as well
(every process of a local job inherits ``SUBMITIT_LOCAL_JOB_ID``). The same fault on the
two-node Slurm cluster: tests/submit/test_slurm_jobs.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from hpcrl.run.job_record import read_job_record
from tests.shipped_cpu_recipes import RECIPES
from tests.slurm.harness import job_processes, wait_no_job_processes
from tests.submit.jobs_harness import hpcrl, job_env, output_of, own_ray_ports_env, wait_for

RECIPE = RECIPES / "grpo-tiny-vllm-1n-cpu.yaml"
TIMEOUT_S = 300
LOCAL_JOB = "SUBMITIT_LOCAL_JOB_ID"


def metrics_steps(run: Path) -> list[int]:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line)["step"] for line in lines]


def vllm_engines(job_id: str) -> list[int]:
    """The job's processes that have vLLM's compiled ops loaded: the engine was built in them
    (the generation worker, a Ray actor)."""
    engines = []
    for line in job_processes(job_id, LOCAL_JOB):
        pid = int(line.split(":")[0])
        try:
            if "/vllm/_C" in Path(f"/proc/{pid}/maps").read_text():
                engines.append(pid)
        except OSError:
            continue
    return engines


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_vllm_job_whose_driver_is_killed_fails_with_137_its_cause_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "hpcrl.cli.main", "submit", str(RECIPE), "--cluster", "local",
            "--wait", "-o", str(run), "grpo.max_num_steps=20"]  # fmt: skip
    env = job_env(**own_ray_ports_env(os.getpid() % 30 + 60))
    out_path = tmp_path / "wait.out"
    with out_path.open("w") as out:
        waiting = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: bool(metrics_steps(run)), TIMEOUT_S, "the first training step")
        job_id = read_job_record(run).job_id
        engines = {pid: psutil.Process(pid).create_time() for pid in vllm_engines(job_id)}
        assert engines, job_processes(job_id, LOCAL_JOB)
        (driver,) = [int(line.split(":")[0]) for line in job_processes(job_id, LOCAL_JOB)
                     if "hpcrl.job.driver_process" in line]  # fmt: skip
        os.kill(driver, signal.SIGSTOP)  # held: the step it last wrote is the last it ran
        killed_after = metrics_steps(run)[-1]
        os.kill(driver, signal.SIGKILL)
        assert waiting.wait(timeout=120) == 137, out_path.read_text()
    finally:
        if waiting.poll() is None:
            os.killpg(waiting.pid, signal.SIGINT)  # detach; then cancel the job itself
            waiting.wait(timeout=30)
            if (run / "job.json").exists():
                hpcrl(["cancel", str(run)], tmp_path, env)
    output = out_path.read_text()
    cause = (
        f"driver killed by signal 9 (SIGKILL: out of memory?) after step {killed_after}; "
        "exit code 137 (log: logs/node0/attempt0/driver.log)"
    )
    assert f"FAILED: job {job_id} FAILED, exit code 137 ({cause})" in output, output
    status = hpcrl(["status", "--json", str(run)], tmp_path, env)
    (shown,) = json.loads(status.stdout)
    assert (shown["state"], shown["exit_code"], shown["cause"]) == ("FAILED", 137, cause), (
        output_of(status)
    )
    # No driver, Ray process or vLLM engine (the generation worker) outlives the job.
    wait_no_job_processes(job_id, variable=LOCAL_JOB)
    # A killed engine can stay a zombie (no environment left to match) until its parent reaps
    # it, and its pid can be reused on a busy machine: only a live process that is the same
    # one counts (seen once in CI: the pid existed right after the job's processes were gone).
    wait_for(lambda: not [pid for pid, started in engines.items() if running(pid, started)],
             30, "the vLLM engines to exit")  # fmt: skip


def running(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
