"""``hpcrl submit --cluster local``: submitit's local executor, no Slurm. Real node
entrypoint and Ray (one local node); a test driver writes the metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.run.job_record import read_job_record
from hpcrl.run.jobspec_file import read_jobspec
from hpcrl.submit.job_state import cancel_job, query_status, rebuild_job
from tests.submit import drivers
from tests.submit.jobs_harness import (
    FRACTION_KEY,
    OFFLOAD_ON,
    ONE_NODE_RECIPE,
    assert_cancelled_logs_end_quietly,
    hpcrl,
    job_env,
    output_of,
    own_ray_ports_env,
    read_json,
    wait_for,
)


def test_local_submit_waits_runs_the_rendered_script_and_reports(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["submit", ONE_NODE_RECIPE, "--cluster", "local", "-o", str(run), "--wait",
            *OFFLOAD_ON, f"{FRACTION_KEY}=0.5"]  # fmt: skip
    env = job_env("tests.submit.drivers:write_metrics", **own_ray_ports_env(os.getpid() % 30))
    result = hpcrl(args, tmp_path, env)
    assert result.returncode == 0, output_of(result)
    record = read_job_record(run)
    assert record.executor == "local" and f"Submitted job {record.job_id}" in result.stdout
    assert "hpcrl logs run -f" in result.stdout
    # the result comes back through submitit; the script's own environment reached the job
    assert rebuild_job(record).task(0).result() == 0
    assert query_status(record).state == "COMPLETED"
    assert "HPCRL_RUN_DIR" in (run / "job.sbatch").read_text()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == drivers.NUM_METRIC_STEPS
    assert read_json(run / "status" / "done")["exit_code"] == 0
    # Ray ran with the job's own token (on by default); it is in its file and nowhere else.
    assert read_jobspec(run).ray_auth == "token"
    token_file = run / "auth" / "ray_token"
    token = token_file.read_bytes().strip()
    holding = [p for p in run.rglob("*") if p.is_file() and token in p.read_bytes()]
    assert (len(token), holding) == (64, [token_file])

    status = hpcrl(["status", str(run)], tmp_path, job_env())
    assert status.returncode == 0, output_of(status)
    expected_reward = drivers.expected_metrics(0.5, drivers.NUM_METRIC_STEPS)["reward_mean"]
    # one run given: every field of it (hpcrl.submit.status_detail)
    assert "state      COMPLETED, exit code 0" in status.stdout.splitlines()
    assert (
        f"progress   step {drivers.NUM_METRIC_STEPS}/20 · reward {expected_reward:.4g}"
        in status.stdout
    )

    logs = hpcrl(["logs", str(run), "--attempt", "1"], tmp_path, job_env())
    assert "===== hpcrl attempt 1 · job " in logs.stdout, output_of(logs)


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_detaches_from_a_local_job_and_cancel_stops_it_and_its_ray(tmp_path: Path) -> None:
    """``submit --wait`` in a terminal of its own (a new session: its process group is the
    foreground group that a terminal's Ctrl-C signals as a whole), Ctrl-C once the driver
    runs: hpcrl detaches (130, no traceback) and the job, in a session of its own, runs on;
    then ``hpcrl cancel`` stops it and its Ray."""
    run = tmp_path / "run"
    args = ["submit", ONE_NODE_RECIPE, "--cluster", "local", "-o", str(run), "--wait"]
    env = job_env("tests.submit.drivers:sleep_forever", **own_ray_ports_env(os.getpid() % 30 + 30))
    # A terminal's shell starts its foreground command with SIGINT at its default; pytest may
    # have inherited it ignored (a script's `cmd &`: CI here ran `.ci/run ... &`), and Python
    # then never raises KeyboardInterrupt (measured: the CLI slept through the Ctrl-C).
    waiting = subprocess.Popen(
        [sys.executable, "-m", "hpcrl.cli.main", *args], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )  # fmt: skip
    record = None
    try:
        job_json = run / "job.json"
        wait_for(lambda: job_json.exists() or waiting.poll() is not None, 120, "the submission")
        record = read_job_record(run)
        sleeping = run / "sleeping"
        wait_for(
            lambda: sleeping.exists() or query_status(record).is_final, 180, "the driver to start"
        )
        assert sleeping.exists(), output_of(hpcrl(["logs", str(run)], tmp_path, job_env()))
        controller = int(record.job_id)
        assert os.getsid(controller) == controller != os.getsid(waiting.pid), "own session"
        os.killpg(waiting.pid, signal.SIGINT)  # the terminal's Ctrl-C
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 130, f"{out}\n{err}"
        assert f"detached: job {record.job_id} is still running" in out and "Traceback" not in err
        assert query_status(record).state == "RUNNING", "Ctrl-C reached the job"
        ray_temp_dir = f"hpcrl-ray-local{record.job_id}"
        assert _processes_mentioning(ray_temp_dir), "Ray runs for the job"
        cancel = hpcrl(["cancel", str(run)], tmp_path, job_env())
        assert cancel.returncode == 0 and f"Cancelled job {record.job_id}" in cancel.stdout, (
            output_of(cancel)
        )
        assert query_status(record).state == "CANCELLED"
        assert _processes_mentioning(ray_temp_dir) == [], "cancel left Ray processes behind"
        assert_cancelled_logs_end_quietly(run, record.job_id, tmp_path)

    finally:
        waiting.kill()
        if record is not None:
            cancel_job(record)  # a failed assertion must not leave the sleeping job behind


@pytest.mark.slow
def test_local_sweep_runs_its_points_one_after_another_and_reports(tmp_path: Path) -> None:
    sweep = tmp_path / "sw"
    args = ["sweep", ONE_NODE_RECIPE, "--cluster", "local", "-o", str(sweep), *OFFLOAD_ON,
            "--grid", f"{FRACTION_KEY}=0.5,1.0", "--wait"]  # fmt: skip
    env = job_env("tests.submit.drivers:write_metrics", **own_ray_ports_env(os.getpid() % 30 + 60))
    result = hpcrl(args, tmp_path, env, timeout_s=400)
    assert result.returncode == 0, output_of(result)
    assert "2 points on local, one after another" in result.stdout
    summary = result.stdout.split("sweep sw")[-1]  # the table after the last point ended
    for index, fraction in enumerate(("0.5", "1.0")):
        row = next(line for line in summary.splitlines() if f"sw/point-{index} " in line)
        assert f"optimizer_offload_fraction={fraction}" in row and "COMPLETED" in row, row
    points = [sweep / "point-0", sweep / "point-1"]
    records = [read_job_record(point) for point in points]
    assert [r.array_index for r in records] == [0, 1]
    assert {r.sweep_dir for r in records} == {str(sweep)} and records[0].job_id != records[1].job_id
    assert [query_status(r).state for r in records] == ["COMPLETED", "COMPLETED"]
    # one after another: point 1's Ray head came up after point 0's driver had finished
    assert (
        read_json(points[1] / "status" / "head")["time"]
        > read_json(points[0] / "status" / "done")["time"]
    )
    assert not (sweep / "job.sbatch").exists(), "a local sweep has no array script"

    report = hpcrl(["report", str(sweep)], tmp_path, job_env())
    assert report.returncode == 0, output_of(report)
    for point, fraction in zip(points, (0.5, 1.0), strict=True):
        row = next(line for line in report.stdout.splitlines() if point.name in line)
        expected = drivers.expected_metrics(fraction, drivers.NUM_METRIC_STEPS)
        assert f"{expected['peak_host_rss_gb']:.4g}" in row, row


def test_a_local_sweep_without_wait_is_refused_with_the_fix(tmp_path: Path) -> None:
    args = ["sweep", ONE_NODE_RECIPE, "--cluster", "local", "-o", str(tmp_path / "sw"),
            *OFFLOAD_ON, "--grid", f"{FRACTION_KEY}=0.5,1.0"]  # fmt: skip
    result = hpcrl(args, tmp_path, job_env())
    assert result.returncode == 2, output_of(result)
    assert "points run one after another" in result.stderr and "add --wait" in result.stderr
    assert not (tmp_path / "sw").exists(), "nothing is written or submitted"
