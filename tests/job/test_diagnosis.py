"""Node 0 names why an attempt failed (hpcrl.job.diagnosis), from the files the job's
processes leave in the run folder: other nodes' reports, the driver's error, its exit."""

from __future__ import annotations

import json
import logging
import time

import attrs
import pytest

from hpcrl.core.workers.failures import WorkerFailed
from hpcrl.job.diagnosis import describe_driver_error, diagnose, killed_by
from hpcrl.job.errors import RayExited
from hpcrl.job.node import _record_failure, _record_save_deadline, report_failure
from hpcrl.job.ray_cluster import ray_exit_detail
from hpcrl.job.settings import read_node_settings
from hpcrl.run.causes import read_cause
from hpcrl.run.markers import (
    DRIVER_ERROR,
    PREEMPTED_EXIT_CODE,
    RAY_READY,
    SAVE_DEADLINE,
    failed_marker_name,
    write_marker,
)
from tests.job.plans import write_node_plan

DRIVER_LOG = "logs/node0/attempt0/driver.log"


def settings_of(run_dir, attempt: int = 0, max_requeues: int = 1):
    environ = {
        "SLURM_JOB_ID": "4242", "SLURM_NODEID": "0", "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n1", "HPCRL_NODE_IP": "10.77.0.11",
        "SLURM_RESTART_COUNT": str(attempt), "HPCRL_MAX_REQUEUES": str(max_requeues),
    }  # fmt: skip
    return read_node_settings(run_dir, environ)


@pytest.fixture
def run(tmp_path):
    """A two-node job's run folder after three training steps and Ray's bring-up."""
    write_node_plan(tmp_path, num_nodes=2)
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": step, "loss": 0.5}) + "\n" for step in (1, 2, 3))
    )
    write_marker(tmp_path, RAY_READY, "4242.0", node_ips=["10.77.0.11", "10.77.0.12"])
    return tmp_path


def test_another_nodes_report_is_the_cause_and_a_lost_node_is_worth_a_requeue(run):
    settings = settings_of(run)
    error = RayExited("Ray on node n2 exited with code 1 ...\nmore", "its Ray exited (raylet "
                      "killed by signal 9)", "logs/node1/attempt0/ray.out")  # fmt: skip
    report_failure(settings_of_node(run, 1), error)
    # the driver's own error (a dead worker) is the echo of the lost node
    write_marker(run, DRIVER_ERROR, "4242.0", rank=1, node_ip="10.77.0.12", died=True,
                 method="train", role="worker rank", error_type="ActorDiedError", message="gone")  # fmt: skip

    cause = diagnose(settings, returncode=1, wait_s=0)

    assert cause.line() == (
        "node 1 (n2) lost after step 3: its Ray exited (raylet killed by signal 9); exit code 1 "
        "(log: logs/node1/attempt0/ray.out)"
    )
    assert cause.retryable
    _record_failure(settings, 1, None, logging.getLogger("test"))
    assert read_cause(run, 0).requeued  # 0 of 1 requeues used
    _record_failure(settings_of(run, attempt=1), 1, None, logging.getLogger("test"))
    assert read_cause(run, 1) is not None and not read_cause(run, 1).requeued  # 1 of 1 used


def settings_of_node(run_dir, rank: int):
    """Node ``rank``'s view of the same attempt (only its rank differs from node 0's here)."""
    settings = settings_of(run_dir)
    return attrs.evolve(settings, task=attrs.evolve(settings.task, node_rank=rank))


def test_a_worker_exception_names_rank_node_and_error_and_is_not_retried(run):
    error = WorkerFailed(rank=1, node_ip="10.77.0.12", method="train", died=False,
                         error_type="ValueError", message="bad batch")  # fmt: skip
    write_marker(run, DRIVER_ERROR, "4242.0", **describe_driver_error(error))
    started = time.monotonic()

    cause = diagnose(settings_of(run), returncode=1, wait_s=30)

    assert time.monotonic() - started < 5, "a worker's own exception needs no other report"
    assert cause.line() == (
        "worker rank 1 on node 1 (n2) raised ValueError in train after step 3: bad batch; exit "
        f"code 1 (log: {DRIVER_LOG})"
    )
    assert not cause.retryable


def test_a_dead_worker_without_a_node_report_and_the_drivers_own_exception(run):
    died = WorkerFailed(rank=0, node_ip="10.77.0.11", method="generate", died=True,
                        error_type="ActorDiedError", message="its process exited unexpectedly: "
                        "killed, or out of memory?", role="generation engine")  # fmt: skip
    write_marker(run, DRIVER_ERROR, "4242.0", **describe_driver_error(died))
    assert diagnose(settings_of(run), 1, wait_s=0).line() == (
        "generation engine 0 on node 0 (n1) died in generate after step 3: its process exited "
        f"unexpectedly: killed, or out of memory?; exit code 1 (log: {DRIVER_LOG})"
    )
    write_marker(run, DRIVER_ERROR, "4242.0", **describe_driver_error(KeyError("reward_mean")))
    assert diagnose(settings_of(run), 1, wait_s=0).line() == (
        f"driver raised KeyError after step 3: 'reward_mean'; exit code 1 (log: {DRIVER_LOG})"
    )


def test_how_the_driver_process_ended(run):
    (run / "metrics.jsonl").unlink()  # before the first step: no step is named
    settings = settings_of(run)
    assert diagnose(settings, -9, wait_s=0).line() == (
        f"driver killed by signal 9 (SIGKILL: out of memory?); exit code 137 (log: {DRIVER_LOG})"
    )
    assert (
        diagnose(settings, 7, wait_s=0).line() == f"driver exited with code 7 (log: {DRIVER_LOG})"
    )
    assert killed_by(15) == "killed by signal 15 (SIGTERM: cancelled, or the job step was ended)"
    assert killed_by(10) == "killed by signal 10 (SIGUSR1)"
    assert killed_by(99) == "killed by signal 99"


def test_reports_of_an_earlier_attempt_are_not_this_attempts_cause(run):
    write_marker(run, failed_marker_name(1), "4242.0", message="old", detail="old news")
    write_marker(run, DRIVER_ERROR, "4242.0", error_type="KeyError", message="old")
    cause = diagnose(settings_of(run, attempt=1), -9, wait_s=0)
    assert cause.what == "driver killed by signal 9 (SIGKILL: out of memory?)"
    assert cause.attempt == 1 and cause.log == "logs/node0/attempt1/driver.log"


RAY_OUT = (
    "2026-12-01 20:37:27,866\tSUCC scripts.py:1250 -- \x1b[32m--------------------\x1b[39m\n"
    "2026-12-01 20:37:51,047\tERR scripts.py:1307 -- \x1b[31mSome Ray subprocesses exited "
    "unexpectedly:\x1b[39m\n"
    "2026-12-01 20:37:51,048\tERR scripts.py:87 -- \x1b[31m\x1b[1mraylet\x1b[22m\x1b[26m\x1b[39m"
    "\x1b[0m\x1b[2m [exit code=-9]\x1b[22m\x1b[0m\n"
    "2026-12-01 20:37:51,048\tERR scripts.py:87 -- \x1b[31m\x1b[1mlog_monitor\x1b[22m\x1b[0m"
    "\x1b[2m [exit code=1]\x1b[22m\x1b[0m\n"
    "2026-12-01 20:37:51,049\tERR scripts.py:115 -- \x1b[31m----- BEGIN raylet.out tail "
    "(exit code(s)=-9 (signal 9)) -----\x1b[39m\n"
    + "[state-dump] counters\n"
    * 3000
    + "2026-12-01 20:37:51,049\tERR scripts.py:1315 -- \x1b[31mRemaining processes will be "
    "killed.\x1b[39m\n"
)


def test_which_of_rays_processes_ended_ray_start(tmp_path):
    assert ray_exit_detail(tmp_path) == ""  # no ray.out
    (tmp_path / "ray.out").write_text("2026-12-01 20:37:27,866\tINFO started\n")
    assert ray_exit_detail(tmp_path) == ""
    (tmp_path / "ray.out").write_text(RAY_OUT)
    assert ray_exit_detail(tmp_path) == "raylet killed by signal 9, log_monitor exited with code 1"


def test_a_worker_out_of_gpu_memory_is_named_with_its_phase_and_peak(run):
    """The driver's report of a worker's ``GpuOutOfMemory`` (hpcrl.core.workers.out_of_memory)
    becomes the ``gpu_oom`` cause: where it ran out and the peak, the peak kept for reports."""
    from hpcrl.run.causes import GPU_OOM, gpu_oom_text

    text = gpu_oom_text("train", 131.25, 139.8, "CUDA out of memory. Tried to allocate 2.00 GiB")
    error = WorkerFailed(rank=0, node_ip="10.77.0.11", method="train", died=False,
                         error_type="GpuOutOfMemory", message=text)  # fmt: skip
    write_marker(run, DRIVER_ERROR, "4242.0", **describe_driver_error(error))

    cause = diagnose(settings_of(run), returncode=1, wait_s=0)

    assert (cause.kind, cause.peak_gpu_mem_gb, cause.retryable) == (GPU_OOM, 131.2, False)
    assert cause.line() == (
        "out of GPU memory at train, peak 131.2 GiB of 139.8 GiB after step 3: worker rank 0 on "
        "node 0 (n1) in train: CUDA out of memory. Tried to allocate 2.00 GiB; exit code 1 "
        f"(log: {DRIVER_LOG})"
    )
    # another exception that merely says so is not taken for one
    other = WorkerFailed(rank=0, node_ip="10.77.0.11", method="train", died=False,
                         error_type="ValueError", message=text)  # fmt: skip
    write_marker(run, DRIVER_ERROR, "4242.0", **describe_driver_error(other))
    assert diagnose(settings_of(run), returncode=1, wait_s=0).kind == "worker_raised"


def test_a_stop_at_the_save_deadline_is_named_with_how_to_go_on_not_as_a_failure(run):
    settings = settings_of(run)
    logger = logging.getLogger("test")
    # the driver's exit code alone (3, as after a preemption) is not such a stop
    assert not _record_save_deadline(settings, PREEMPTED_EXIT_CODE, logger)
    write_marker(run, SAVE_DEADLINE, "4241.0", step=2, checkpoint="x")  # an earlier job's
    assert not _record_save_deadline(settings, PREEMPTED_EXIT_CODE, logger)
    assert read_cause(run, 0) is None

    write_marker(run, SAVE_DEADLINE, "4242.0", step=3, checkpoint=f"{run}/checkpoints/step_3")
    assert not _record_save_deadline(settings, 1, logger)  # it failed after writing it
    assert _record_save_deadline(settings, PREEMPTED_EXIT_CODE, logger)

    cause = read_cause(run, 0)
    assert cause is not None and not cause.requeued and not cause.retryable
    assert cause.line() == (
        f"stopped at checkpointing.checkpoint_must_save_by after step 3: checkpoint saved "
        f"({run}/checkpoints/step_3); hpcrl resume {run} continues the run from it"
    )
