"""Faults inside a running job, on the real two-node test Slurm cluster, with the real driver.

One two-node GRPO job meets three faults: ``scancel --signal=USR2`` (what Slurm sends before
the time limit or on preemption) makes the training driver checkpoint at a step boundary
and the job is REQUEUED (the ``scontrol requeue`` that asks for it outlives the SIGTERM it
brings: ``scontrol_slow_after_requeue``); in the next attempt node 2 is lost (its raylet
killed) and the job is REQUEUED again; in the third node 2's slurmd stops, Slurm marks n2 DOWN and ends the
attempt NODE_FAIL and requeues the job itself; the fourth attempt resumes from the last
checkpoint and COMPLETES. Each attempt's end is named in one line (what, where, after which
step, which log), Slurm's requeue counts against max_requeues like hpcrl's, no process of
the job outlives an attempt, and the metrics equal those of an uninterrupted run of the same
seed, step for step.

While n2's slurmd is stopped the test holds the driver (SIGSTOP) at an odd step: Slurm takes
SlurmdTimeout (20 s on the test cluster, tests/slurm/cluster.sh) and its next ping to call
the node DOWN, longer than the rest of the training. Slurm's kill of the step sends SIGCONT
before SIGTERM, so the held driver may still finish the step in flight and start its save
(CI, 2026-12-02: step 4 recorded, its save cut short). What the attempt left (its last
recorded step, the newest complete checkpoint) is read while n2 is down and nothing of the
job runs; the cause must name that step and the next attempt resume from that checkpoint.

The same job is the suite's real two-node training run: GRPO across the nodes learns (and the
shipped 2-node CPU recipe's submit test, tests/shipped_cpu_recipes.py).

A Python exception in a worker (a Ray actor) on node 2 is named by rank, node and exception.
(The driver killed by SIGKILL, as the OOM killer does: tests/submit/test_slurm_jobs.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from hpcrl.run.causes import read_causes
from hpcrl.run.checkpoints import complete_checkpoints
from hpcrl.run.job_record import read_job_record
from hpcrl.submit.status_view import ListedRun, run_statuses
from tests.shipped_cpu_recipes import assert_finite_steps
from tests.slurm.harness import wait_no_job_processes, wait_sacct_states
from tests.submit import failing_workers
from tests.submit.jobs_harness import (
    REPO,
    TWO_NODE_RECIPE,
    hpcrl,
    job_env,
    output_of,
    read_json,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

# checkpoints every 2 steps, and when preempted
RUN = ("grpo.max_num_steps=12", "checkpointing.enabled=true", "checkpointing.save_period=2")
NUM_STEPS = 12


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def last_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    return json.loads(lines[-1])["step"] if lines else 0


def uninterrupted_run(run_dir: Path) -> subprocess.Popen[str]:
    """The same training straight through, in a process of its own on this machine
    (``python -m hpcrl.core.driver``: a local Ray; the one-node recipe the two-node one
    derives from, planned on the local profile: the same two FSDP ranks on one node)."""
    from tests.core._driver_harness import write_run_dir

    write_run_dir(run_dir, "grpo-tiny-1n-cpu.yaml", list(RUN))
    env = job_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")  # as slurm-test's env sets them
    return subprocess.Popen(
        [sys.executable, "-m", "hpcrl.core.driver", str(run_dir)], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


CLUSTER_SH = str(REPO / "tests" / "slurm" / "cluster.sh")
MAX_REQUEUES = 3


def requeueing_profile(tmp_path: Path) -> Path:
    profile = yaml.safe_load((REPO / "cluster_profiles" / "slurm-test.yaml").read_text())
    profile["name"] = "slurm-test-requeue-thrice"
    profile["slurm"]["max_requeues"] = MAX_REQUEUES
    path = tmp_path / "requeue.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def scontrol_slow_after_requeue(folder: Path) -> dict[str, str]:
    """The job's environment with a test stand-in ``scontrol`` first on PATH: a Python that
    runs the real one and, after ``requeue``, takes 3 s more to exit (below the test
    cluster's KillWait of 5 s). Slurm's requeue SIGTERMs every process of the job step at
    once, the scontrol that asked included; this makes the signal land before scontrol exits
    every time, as it did by chance on a loaded CI machine (2026-12-07), for submitit's
    requeue after USR2 and for hpcrl's own after a lost node. (Not a shell: sh waiting on a
    ``sleep`` that SIGTERM ended went on to exit 0.)"""
    real = shutil.which("scontrol")
    assert real is not None, "the test Slurm cluster's scontrol is not on PATH"
    wrapper = folder / "slow-scontrol" / "scontrol"
    wrapper.parent.mkdir()
    wrapper.write_text(
        f"#!{sys.executable}\nimport subprocess, sys, time\n"
        f"code = subprocess.call([{real!r}, *sys.argv[1:]])\n"
        'if sys.argv[1:2] == ["requeue"]:\n    time.sleep(3)\nsys.exit(code)\n'
    )
    wrapper.chmod(0o755)
    environment = job_env()
    return {**environment, "PATH": f"{wrapper.parent}{os.pathsep}{environment['PATH']}"}


def _process(*needles: str) -> psutil.Process:
    """The one live process whose command line holds every needle."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["status"] != psutil.STATUS_ZOMBIE and all(n in cmdline for n in needles):
            found.append(process)
    assert len(found) == 1, f"{len(found)} processes match {needles}"
    return found[0]


def resumed_at(run: Path, attempt: int) -> int | None:
    """The step the driver of ``attempt`` (counted from 1) resumed from, once it says so."""
    try:
        text = (run / f"logs/node0/attempt{attempt - 1}/driver.log").read_text()
    except FileNotFoundError:
        return None
    _, found, after = text.partition(f"resumed from {run}/checkpoints at step ")
    return int(after.split()[0]) if found else None


def training_again(run: Path, attempt: int) -> Callable[[], bool]:
    def check() -> bool:
        resumed = resumed_at(run, attempt)
        return resumed is not None and last_step(run) > resumed

    return check


def resume_points(recorded_step: int, floor: int) -> set[int]:
    """The checkpoints a run that recorded ``recorded_step`` last can resume from (saved every
    2 steps, after the step's metrics line; none older than ``floor``): an odd step began only
    after the previous even step's save was complete; an even step's own save may have been
    cut short."""
    if recorded_step % 2:
        return {max(floor, recorded_step - 1)}
    return {max(floor, recorded_step), max(floor, recorded_step - 2)}


def hold_the_driver_after_an_odd_step(run: Path) -> tuple[psutil.Process, int]:
    """SIGSTOP the driver right after an odd step (a save follows only even ones)."""
    driver = _process("hpcrl.job.driver_process", str(run))
    while True:
        wait_for(lambda: last_step(run) % 2 == 1, 120, "an odd training step", interval_s=0.05)
        driver.suspend()
        step = last_step(run)
        if step % 2 == 1:
            return driver, step
        driver.resume()


def node_fail_seen(run: Path) -> bool:
    (shown,) = run_statuses([ListedRun(name="run", path=run)])
    return shown.state == "PENDING" and "NODE_FAIL" in (shown.cause or "")


def assert_matches_the_uninterrupted_run(got: list[dict], want: list[dict]) -> None:
    """No step lost, none done twice, each as in the run without interruptions."""
    assert [m["step"] for m in got] == list(range(1, NUM_STEPS + 1)) == [m["step"] for m in want]
    for resumed, straight in zip(got, want, strict=True):
        assert resumed["sample_response"] == straight["sample_response"], resumed["step"]
        assert resumed["reward_mean"] == pytest.approx(straight["reward_mean"], abs=1e-6)
        assert resumed["loss"] == pytest.approx(straight["loss"], abs=1e-5)
    # GRPO across the two nodes learns (the margin of tests/core/test_demo.py's 20 steps,
    # a little less for 12)
    rewards = [m["reward_mean"] for m in got]
    assert sum(rewards[-3:]) / 3 >= sum(rewards[:3]) / 3 + 0.2, rewards


def assert_each_attempts_logs_apart(run: Path, cwd: Path, job_id: str, num_attempts: int) -> None:
    attempts = set(range(1, num_attempts + 1))
    for attempt in attempts:
        logs = hpcrl(["logs", str(run), "--attempt", str(attempt)], cwd, job_env())
        assert f"===== hpcrl attempt {attempt} · job {job_id}" in logs.stdout, output_of(logs)
        assert all(f"===== hpcrl attempt {other} " not in logs.stdout
                   for other in attempts - {attempt})  # fmt: skip
        assert f"\n[node0 attempt{attempt} driver.log] " in logs.stdout


def test_preempted_then_two_lost_nodes_each_requeue_resume_and_match_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    args = ["submit", TWO_NODE_RECIPE, *RUN, "--cluster", str(requeueing_profile(tmp_path)),
            "-o", str(run), "--wait"]  # fmt: skip
    out_path = tmp_path / "wait.out"
    with out_path.open("w") as out:
        waiting = subprocess.Popen([sys.executable, "-m", "hpcrl.cli.main", *args], cwd=tmp_path,
                                   env=scontrol_slow_after_requeue(tmp_path), stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    job_id, reference, slurmd_stopped = None, None, False
    try:
        wait_for(lambda: (run / "job.json").exists(), 60, "the submission")
        job_id = read_job_record(run).job_id
        wait_for(lambda: last_step(run) >= 1, 240, "the first training step")
        token = (run / "auth" / "ray_token").read_text()
        # what Slurm sends before the time limit or on preemption
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
        reference = uninterrupted_run(tmp_path / "straight")  # meanwhile, on this machine
        wait_for(training_again(run, 2), 240, "attempt 2 to train")
        # node 2 lost: its raylet killed (the simulated node's Ray dies with it)
        _process("raylet/raylet", f"hpcrl-ray-{job_id}-1").kill()
        wait_for(training_again(run, 3), 240, "attempt 3 to train")
        # node 2 lost: its slurmd stopped
        _, held_at = hold_the_driver_after_an_odd_step(run)
        subprocess.run(["bash", CLUSTER_SH, "node-stop", "n2"], check=True, timeout=60)
        slurmd_stopped = True
        wait_for(lambda: node_fail_seen(run), 120, "Slurm to end attempt 3 NODE_FAIL")
        # Slurm killed node 0's step; node 1's (slurmd gone, slurmstepd lives) stops on its own
        wait_no_job_processes(job_id, timeout_s=30)
        # what attempt 3 left: attempt 4 cannot start before n2 is back
        left_after_step = last_step(run)
        left_checkpoint = complete_checkpoints(run / "checkpoints")[-1][0]
        subprocess.run(["bash", CLUSTER_SH, "node-start", "n2"], check=True, timeout=150)
        slurmd_stopped = False
        wait_for(training_again(run, 4), 240, "attempt 4 to train")
        assert waiting.wait(timeout=240) == 0, out_path.read_text()
        assert reference.wait(timeout=240) == 0, reference.stdout.read() if reference.stdout else ""
    finally:  # never leave anything running, n2 back in service for the tests after this
        for process in (waiting, reference):
            if process is not None and process.poll() is None:
                process.kill()
        if job_id is not None:
            subprocess.run(["scancel", job_id], check=False, timeout=30)
        if slurmd_stopped:
            subprocess.run(["bash", CLUSTER_SH, "node-start", "n2"], check=False, timeout=150)
    output = out_path.read_text()
    wait_sacct_states(job_id, ["REQUEUED", "REQUEUED", "NODE_FAIL", "COMPLETED"])

    preempted, lost, node_failed = read_causes(run)
    assert resumed_at(run, 2) == preempted.after_step  # the checkpoint saved when preempted
    assert resumed_at(run, 3) in resume_points(lost.after_step, floor=preempted.after_step)
    assert preempted.titled_line() == (
        f"attempt 1: preempted (USR2: time limit or preemption) after step {preempted.after_step}: "
        "the driver saved a checkpoint; requeued, the next attempt resumes from the last "
        "checkpoint (log: logs/node0/attempt0/node.log)"
    )
    assert lost.titled_line() == (
        f"attempt 2: node 1 (n2) lost after step {lost.after_step}: its Ray exited (raylet "
        "killed by signal 9); exit code 1; requeued, the next attempt resumes from the last "
        "checkpoint (log: logs/node1/attempt1/ray.out)"
    )
    # held after step held_at; Slurm's SIGCONT may let the step in flight end (and start a save)
    assert left_after_step in (held_at, held_at + 1)
    assert left_checkpoint in resume_points(left_after_step, floor=held_at - 1)
    assert node_failed.titled_line() == (
        f"attempt 3: node 1 (n2) lost after step {left_after_step}: its slurmd stopped answering (Slurm "
        "marked the node DOWN and ended the attempt NODE_FAIL); requeued, the next attempt "
        f"resumes from the last checkpoint (log: submitit/{job_id}_0_log.err)"
    )
    assert resumed_at(run, 4) == left_checkpoint
    # Slurm's requeue counted: the last allowed attempt made the job non-requeueable
    assert (
        f"{MAX_REQUEUES} of {MAX_REQUEUES} requeues used: Slurm will not requeue the job again "
        "(Requeue=0)" in (run / "logs/node0/attempt3/node.log").read_text()
    )
    for cause in (preempted, lost, node_failed):  # --wait said so as it happened
        assert f"job {job_id} {cause.titled_line()}" in output, output
    assert f"done: job {job_id} COMPLETED, exit code 0" in output
    assert "training step" in output  # --wait showed the progress it saw
    assert_matches_the_uninterrupted_run(metrics(run), metrics(tmp_path / "straight"))
    assert_finite_steps(metrics(run), NUM_STEPS, "grpo")  # the shipped 2-node recipe's check
    (shown,) = run_statuses([ListedRun(name="run", path=run)])
    assert (shown.state, shown.attempts, shown.step) == ("COMPLETED", 4, NUM_STEPS)
    assert shown.cause == node_failed.titled_line()
    assert_each_attempts_logs_apart(run, tmp_path, job_id, 4)
    assert not (run / "PREEMPT").exists()
    assert (run / "auth" / "ray_token").read_text() == token  # every attempt used the same
    wait_no_job_processes(job_id)


def test_a_worker_exception_on_node_2_is_named_by_rank_and_nothing_is_left(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["submit", TWO_NODE_RECIPE, "--cluster", "slurm-test", "-o", str(run), "--wait"]
    result = hpcrl(args, tmp_path, job_env("tests.submit.failing_workers:worker_raises"))
    assert result.returncode == 1, output_of(result)
    record = read_job_record(run)
    cause = (
        f"worker rank 1 on node 1 (n2) raised ValueError in step: {failing_workers.FAILURE}; "
        "exit code 1 (log: logs/node0/attempt0/driver.log)"
    )
    assert f"FAILED: job {record.job_id} FAILED, exit code 1 ({cause})" in result.stdout
    assert (run / "workers_started").read_text().split() == ["10.77.0.11", "10.77.0.12"]
    # rank 0 was still blocked in its step: the job ended without waiting for it
    assert (
        read_json(run / "status" / "done")["time"] - os.path.getmtime(run / "workers_started") < 60
    )
    assert (
        f"ValueError: {failing_workers.FAILURE}"
        in (run / "logs/node0/attempt0/driver.log").read_text()
    )
    wait_sacct_states(record.job_id, ["FAILED"])
    (shown,) = run_statuses([ListedRun(name="run", path=run)])
    assert (shown.state, shown.exit_code, shown.cause) == ("FAILED", 1, cause)
    logs = hpcrl(["logs", str(run)], tmp_path, job_env())
    assert logs.stdout.rstrip().endswith(f"\n[hpcrl] attempt 1: {cause}"), output_of(logs)
    wait_no_job_processes(record.job_id)
