"""hpcrl submit / status / logs / cancel against the real two-node test Slurm cluster.

Every job goes through ``hpcrl`` as a user runs it: the renderer writes the run folder, the
rendered-script submitit executor submits it, the real node entrypoint brings up Ray on the
job's nodes, and a test driver (tests/submit/drivers.py) stands in for training, except
where the real training driver is the point (a driver killed as by the OOM killer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hpcrl.config.port_bands import band_ports
from hpcrl.run.job_record import JobRecord, read_job_record
from hpcrl.submit.job_state import query_status, rebuild_job
from hpcrl.submit.submission import slurm_cluster_name
from tests.slurm.harness import (
    NETNS_NODE_IPS,
    cluster_mode,
    job_processes_by_node,
    require_netns_cluster,
    sacct_exit_codes,
    sacct_states,
    wait_no_job_processes,
    wait_sacct_states,
)
from tests.submit.jobs_harness import (
    ONE_NODE_OVERRIDES,
    ONE_NODE_RECIPE,
    REPO,
    TWO_NODE_RECIPE,
    assert_cancelled_logs_end_quietly,
    hpcrl,
    job_env,
    output_of,
    read_json,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

#: The Ray port band the busy-port test pins its job to.
BUSY_PORT_BAND = 7


def test_two_node_job_runs_the_rendered_script_and_ray_spans_both_nodes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["submit", TWO_NODE_RECIPE, "--cluster", "slurm-test", "-o", str(run), "--wait"]
    result = hpcrl(args, tmp_path, job_env("hpcrl.job.probe:run_probe"))
    assert result.returncode == 0, output_of(result)
    record = read_job_record(run)
    assert (record.executor, record.num_tasks) == ("slurm", 2)
    # kept with the job id: a record is matched to its own job (tests/submit/test_job_identity.py)
    assert record.slurm_cluster is not None and record.slurm_cluster == slurm_cluster_name()
    # submitit's private hook still applies: the script it submitted IS the rendered one
    submitted = Path(record.submitit_folder) / f"{record.job_id}_submission.sh"
    assert submitted.read_bytes() == (run / "job.sbatch").read_bytes()
    # the results of both tasks come back through submitit (task 0's is the driver's code)
    assert rebuild_job(record).results() == [0, 0]
    wait_sacct_states(record.job_id, ["COMPLETED"])
    probe = read_json(run / "probe.json")
    assert probe["problems"] == [] and probe["num_alive_nodes"] == 2
    assert sorted(task["hostname"] for task in probe["tasks"]) == ["n1", "n2"]
    if cluster_mode() == "netns":
        assert probe["alive_node_ips"] == sorted(NETNS_NODE_IPS.values())


#: The real driver's run in the OOM test: checkpoints every step, so a resume has one.
OOM_RUN = ("grpo.max_num_steps=20", "checkpointing.enabled=true", "checkpointing.save_period=1")


@pytest.mark.timeout(480)
def test_a_driver_killed_as_by_the_oom_killer_fails_with_137_its_cause_and_the_logs(
    tmp_path: Path,
) -> None:
    """The real training driver of the two-node CPU GRPO recipe, SIGKILLed after its first
    step, as the kernel's OOM killer does: the job fails with 137 and the named cause
    (``--wait``, ``status``, sacct), and no process of the job is left on either node (Ray's
    raylets and the training workers on both were running when it was killed)."""
    run = tmp_path / "run"
    args = ["submit", TWO_NODE_RECIPE, *OOM_RUN, "--cluster", "slurm-test", "-o", str(run),
            "--wait"]  # fmt: skip
    out_path = tmp_path / "wait.out"
    with out_path.open("w") as out:
        waiting = subprocess.Popen(
            [sys.executable, "-m", "hpcrl.cli.main", *args], cwd=tmp_path,
            env=job_env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: (run / "checkpoints" / "step_000001").is_dir(), 300, "step 1's save")
        job_id = read_job_record(run).job_id
        before = job_processes_by_node(job_id)
        for node in ("n1", "n2"):  # Ray and a training worker on each node
            assert any("raylet" in line for line in before.get(node, [])), before
            assert any("ray::" in line for line in before.get(node, [])), before
        (driver,) = [line for line in before["n1"] if "hpcrl.job.driver_process" in line]
        os.kill(int(driver.split(":")[0]), signal.SIGSTOP)  # held: a step it said it ran ...
        killed_after = last_metrics_step(run)
        os.kill(int(driver.split(":")[0]), signal.SIGKILL)  # ... is the last it ran
        assert waiting.wait(timeout=120) == 137, out_path.read_text()
    finally:
        if waiting.poll() is None:
            waiting.kill()
        if (run / "job.json").exists():
            subprocess.run(["scancel", read_job_record(run).job_id], check=False, timeout=30)
    record, output = read_job_record(run), out_path.read_text()
    cause = (
        f"driver killed by signal 9 (SIGKILL: out of memory?) after step {killed_after}; "
        "exit code 137 (log: logs/node0/attempt0/driver.log)"
    )
    assert f"FAILED: job {record.job_id} FAILED, exit code 137 ({cause}) · step" in output
    # the log tails are shown, as hpcrl logs prints them
    assert "[node0 attempt1 driver.log] [hpcrl " in output
    assert "running driver hpcrl.core.driver:run_training" in output
    wait_sacct_states(record.job_id, ["FAILED"])
    # Slurm's own record has the driver's code too: the batch script's status, which srun passed
    # on (Python's exit would leave 1:0; why not DerivedExitCode: sacct_exit_codes)
    assert sacct_exit_codes(record.job_id) == ["9:0"]
    # (--json: the table folds a long cause at a width that depends on the run's path)
    status = hpcrl(["status", "--json", str(run)], tmp_path, job_env())
    (shown,) = json.loads(status.stdout)
    assert (shown["state"], shown["exit_code"]) == ("FAILED", 137), output_of(status)
    assert shown["cause"] == cause, output_of(status)
    wait_no_job_processes(record.job_id)
    assert job_processes_by_node(record.job_id) == {}
    assert_resume_runs_the_next_attempt(run, record, tmp_path)


def last_metrics_step(run: Path) -> int:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])["step"]


def assert_resume_runs_the_next_attempt(run: Path, first: JobRecord, tmp_path: Path) -> None:
    """hpcrl resume submits the same run folder again as its next attempt (the checkpoint
    the killed driver saved makes it resumable). A quick driver, the Ray probe, runs that
    attempt: the real driver's resume, step for step, is tests/submit/test_slurm_faults.py."""
    assert sorted(path.name for path in (run / "checkpoints").iterdir())[:1] == ["step_000001"]
    resumed = hpcrl(["resume", str(run), "--wait"], tmp_path, job_env("hpcrl.job.probe:run_probe"))
    assert resumed.returncode == 0, output_of(resumed)
    assert f"as attempt 2; job {first.job_id} had ended FAILED" in resumed.stdout
    record = read_job_record(run)
    assert record.job_id != first.job_id and record.earlier_job_ids == (first.job_id,)
    wait_sacct_states(record.job_id, ["COMPLETED"])
    # Its own submitit files, its attempt numbered after the first job's, logs apart.
    banner = f"===== hpcrl attempt 2 · job {record.job_id} · node 0 ("
    assert banner in (run / "submitit" / f"{record.job_id}_0_log.out").read_text()
    assert sorted(p.name for p in (run / "logs" / "node0").iterdir()) == ["attempt0", "attempt1"]
    status = hpcrl(["status", str(run), "--json"], tmp_path, job_env())
    (row,) = json.loads(status.stdout)
    assert (row["state"], row["attempts"]) == ("COMPLETED", 2), status.stdout
    # the first attempt's cause is still there, under its own number
    assert row["cause"] is None or row["cause"].startswith("attempt 1: driver killed")


def test_cancel_stops_a_running_job_and_a_sweep_with_its_resumed_point(tmp_path: Path) -> None:
    """A sweep of two sleeping points (one node each, side by side): cancelling point 1 stops
    its array task; resumed, point 1 runs as a job of its own, which ``hpcrl cancel SWEEP``
    must stop as well as the array (point 0)."""
    sweep_dir = tmp_path / "sweep"
    args = ["sweep", ONE_NODE_RECIPE, *ONE_NODE_OVERRIDES, "--cluster", "slurm-test",
            "--grid", "grpo.seed=1,2", "-o", str(sweep_dir)]  # fmt: skip
    env = job_env("tests.submit.drivers:sleep_forever")
    result = hpcrl(args, tmp_path, env)
    assert result.returncode == 0, output_of(result)
    point0, point1 = sweep_dir / "point-0", sweep_dir / "point-1"
    task0, task1 = read_job_record(point0), read_job_record(point1)
    array_id = task0.array_job_id
    resumed: JobRecord | None = None
    try:
        wait_for(lambda: (point1 / "sleeping").exists(), 180, "point 1's driver to start")
        assert query_status(task1).state == "RUNNING"
        cancel = hpcrl(["cancel", str(point1)], tmp_path, job_env())
        assert cancel.returncode == 0 and f"Cancelled job {array_id}_1" in cancel.stdout, output_of(
            cancel
        )
        wait_for(lambda: query_status(task1).state == "CANCELLED", 30, "sacct to say CANCELLED")
        status = hpcrl(["status", str(point1), "--json"], tmp_path, job_env())
        assert json.loads(status.stdout)[0]["state"] == "CANCELLED", output_of(status)
        err = Path(task1.submitit_folder) / f"{task1.job_id}_0_log.err"
        wait_for(lambda: "CANCELLED AT" in err.read_text(), 30, "slurmstepd's line")
        time.sleep(2)  # the last lines of the stopping processes
        assert_cancelled_logs_end_quietly(point1, task1.job_id, tmp_path)
        again = hpcrl(["cancel", str(point1)], tmp_path, job_env())
        assert f"Job {array_id}_1 already ended (CANCELLED)" in again.stdout, output_of(again)

        # A stand-in checkpoint (the sleeping driver reads none) makes point 1 resumable.
        (point1 / "checkpoints" / "step_000001").mkdir(parents=True)
        (point1 / "sleeping").unlink()
        resume = hpcrl(["resume", str(point1)], tmp_path, env)
        assert resume.returncode == 0, output_of(resume)
        resumed = read_job_record(point1)
        assert "_" not in resumed.job_id and resumed.earlier_job_ids == (f"{array_id}_1",)
        wait_for(lambda: (point1 / "sleeping").exists(), 180, "the resumed job's driver")

        cancel = hpcrl(["cancel", str(sweep_dir)], tmp_path, job_env())
        assert cancel.returncode == 0, output_of(cancel)
        said = " ".join(cancel.stdout.split())  # rich folds long lines
        assert f"Cancelled job array {array_id} (2 points) of {sweep_dir}" in said, said
        assert f"Cancelled job {resumed.job_id} ({point1})" in said, said
        for record in (task0, resumed):
            wait_for(lambda r=record: query_status(r).state == "CANCELLED", 30, f"{record.job_id}")
    finally:  # never leave them running
        for job_id in (array_id, *([resumed.job_id] if resumed else [])):
            subprocess.run(["scancel", job_id], check=False, timeout=30)


@pytest.fixture
def busy_port_on_n2() -> Iterator[int]:
    """Hold node n2's Ray node-manager port (as a stale process on a shared node would).

    The port is the one of band ``BUSY_PORT_BAND``, which the test pins the job to (the band
    would otherwise come from the job id, unknown before submission)."""
    port = band_ports(BUSY_PORT_BAND)["node_manager_port"]
    require_netns_cluster("holding a port of node n2 alone")
    holder = subprocess.Popen(
        ["nsenter", "--net=/run/netns/n2", sys.executable, "-c",
         "import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
         f"s.bind(('{NETNS_NODE_IPS['n2']}', {port})); s.listen(); print('bound', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "bound"
        yield port
    finally:
        holder.kill()
        holder.wait()


def test_worker_that_cannot_join_fails_the_job_with_its_cause(
    tmp_path: Path, busy_port_on_n2: int
) -> None:
    run = tmp_path / "run"
    args = ["submit", TWO_NODE_RECIPE, "--cluster", "slurm-test", "-o", str(run), "--wait"]
    result = hpcrl(
        args,
        tmp_path,
        job_env(
            "hpcrl.job.probe:run_probe",
            HPCRL_JOIN_TIMEOUT_S="60",
            HPCRL_RAY_PORT_BAND=str(BUSY_PORT_BAND),
        ),
    )
    assert result.returncode != 0, output_of(result)
    assert f"port {busy_port_on_n2} already in use on node n2" in result.stdout, output_of(result)
    assert sacct_states(read_job_record(run).job_id)[-1] == "FAILED"


def test_a_refused_submission_says_why_and_the_same_command_submits_once_fixed(
    tmp_path: Path,
) -> None:
    """sbatch refuses a bad partition: the folder is left as rendered and says why (status),
    the same command may be run again (with -o the same folder, without it no ``-2``, ``-3``
    folder per try), and once the profile is fixed the same command submits. Issue 26 item 3:
    at 167264e the folder refused every later submit (``-o``) or a numbered one was made per
    retry."""
    profile = yaml.safe_load((REPO / "cluster_profiles" / "slurm-test.yaml").read_text())
    profile.update(name="slurm-test-bad-partition")
    profile["slurm"]["partition"] = "no-such-partition"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(profile))
    run = tmp_path / "run"
    args = ["submit", TWO_NODE_RECIPE, "--cluster", str(tmp_path / "bad.yaml"), "-o", str(run)]
    for _ in range(2):  # the same command again: the same folder, refused for the same reason
        result = hpcrl(args, tmp_path, job_env())
        assert result.returncode == 1, output_of(result)
        assert f"not submitted: sbatch refused {run}/job.sbatch" in result.stderr
        assert result.stderr.count("invalid partition specified: no-such-partition") == 1
        assert not (run / "job.json").exists() and not (run / "submitit").exists()
    status = hpcrl(["status", str(run)], tmp_path, job_env())
    assert "state      not submitted" in status.stdout, output_of(status)
    assert (
        "cause      sbatch refused it: sbatch: error: Batch job submission failed: Invalid "
        "partition name specified (" in status.stdout
    )
    without_out = args[:-2]
    for _ in range(2):
        assert hpcrl(without_out, tmp_path, job_env()).returncode == 1
    # one folder for both tries (beside it the runs' compile cache, .hpcrl-cache)
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    assert folder.name.startswith("grpo-tiny-2n-cpu-slurm-test-bad-partition-")
    assert not folder.name.endswith("-2")

    profile["slurm"]["partition"] = "debug"  # the user fixes the profile ...
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(profile))
    result = hpcrl(args, tmp_path, job_env())  # ... and runs the same command
    assert result.returncode == 0, output_of(result)
    record = read_job_record(run)
    assert f"Submitted job {record.job_id}" in result.stdout
    assert not (run / "submit_failed.json").exists()
    hpcrl(["cancel", str(run)], tmp_path, job_env())
