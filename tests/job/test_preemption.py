"""Preemption through submitit's own signal handling (its local executor, real Ray, one node).

The job's task gets USR2 as Slurm would send it; submitit calls ``NodeMain.checkpoint``, which
asks the driver to checkpoint (``PREEMPT``), waits for it, and returns the resubmission; the
local executor then restarts the task, which resumes from the checkpoint and completes.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import psutil
import pytest
import submitit

from hpcrl.job.node import NodeMain
from tests.job.simulated import SimulatedJob, free_port_base, processes_of_job

pytestmark = pytest.mark.timeout(300)


def wait_for(path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.2)


def test_usr2_checkpoints_the_driver_and_the_requeued_attempt_resumes(
    tmp_path, monkeypatch, request
):
    request_cleanup = request.addfinalizer
    job = SimulatedJob(run_dir=tmp_path / "run", num_nodes=1, port_base=free_port_base(os.getpid()))
    job.write_plan()
    env = job.node_env(0) | {"HPCRL_DRIVER": "tests.job.drivers:checkpoint_on_preempt",
                             "HPCRL_MAX_REQUEUES": "1",
                             # Ray's temp dirs named after the job, to find its processes.
                             "HPCRL_RAY_TEMP_ROOT": f"/tmp/{job.job_id}"}  # fmt: skip
    for name in [name for name in os.environ if name.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if not name.startswith("SLURM_"):  # the local executor: no Slurm variables
            monkeypatch.setenv(name, value)
    temp_root = env["HPCRL_RAY_TEMP_ROOT"]
    request_cleanup(lambda: shutil.rmtree(temp_root, ignore_errors=True))
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit", max_num_timeout=1)
    executor.update_parameters(timeout_min=10)

    submitted = executor.submit(NodeMain(), str(job.run_dir))
    wait_for(job.run_dir / "driver_started", 120)
    controller = psutil.Process(submitted._process.pid)
    (task,) = controller.children()
    task.send_signal(signal.SIGUSR2)  # what Slurm sends before the time limit / on preemption

    assert submitted.result() == 0
    first = (job.run_dir / "logs/node0/attempt0/node.log").read_text()
    assert "driver exited with code 3 after the preemption signal" in first
    assert "Ray stopped" in first
    second = (job.run_dir / "logs/node0/attempt1/node.log").read_text()
    assert "driver exited with code 0" in second
    assert (
        "driver: resumed from step 7"
        in (job.run_dir / "logs/node0/attempt1/driver.log").read_text()
    )
    assert not (job.run_dir / "PREEMPT").exists()
    assert processes_of_job(job) == []
