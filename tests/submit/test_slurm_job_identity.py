"""Job identity against the real test cluster's sacct: a run's job is its id *and* its
submit time and cluster. An old job.json whose id is now another (real) job's is reported
STALE with whose it is; the same id with the right submit time is that job; a real requeue's
rows stay the job's own attempts."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from pathlib import Path

import attrs
import pytest

from hpcrl.run.job_record import JobRecord, write_job_record
from hpcrl.submit.job_state import query_status
from hpcrl.submit.submission import slurm_cluster_name
from tests.slurm.harness import run_slurm, wait_sacct_states
from tests.submit.jobs_harness import REPO, hpcrl, job_env, output_of

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


def sbatch(tmp_path: Path, command: str, *options: str) -> str:
    out = run_slurm("sbatch", "--parsable", "-o", str(tmp_path / "slurm-%j.out"), *options,
                    "--wrap", command)  # fmt: skip
    return out.strip().split(";")[0]


def sacct_row(job_id: str) -> dict[str, str]:
    """The first attempt's Submit (epoch seconds) and Cluster, as sacct says them."""
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    out = subprocess.run(
        ["sacct", "-X", "-D", "-P", "-n", "-o", "Submit,Cluster", "-j", job_id],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    ).stdout  # fmt: skip
    submit, cluster = out.splitlines()[0].split("|")
    return {"submit": submit, "cluster": cluster}


def iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds")


def job_record(run: Path, job_id: str, submitted_at: str, cluster: str | None) -> JobRecord:
    record = JobRecord(
        executor="slurm", job_id=job_id, job_name="old-run", cluster="slurm-test",
        submitit_folder=str(run / "submitit"), num_tasks=1, submitted_at=submitted_at,
        max_requeues=0, slurm_cluster=cluster,
    )  # fmt: skip
    run.mkdir(parents=True)
    write_job_record(run, record)
    return record


def test_an_old_record_of_a_reused_job_id_is_stale_not_the_new_jobs_state(tmp_path: Path) -> None:
    job_id = sbatch(tmp_path, "true")
    wait_sacct_states(job_id, ["COMPLETED"])
    real = sacct_row(job_id)
    assert slurm_cluster_name() == real["cluster"]  # what hpcrl submit records
    # A run submitted three days ago as job <job_id> that never ran (its cluster was reset):
    old = job_record(tmp_path / "old", job_id, iso(int(real["submit"]) - 3 * 86_400), None)
    status = query_status(old)
    assert status.state == "STALE"
    assert f"the scheduler's job {job_id} is another job (submitted {iso(int(real['submit']))}" in (
        status.stale
    )
    result = hpcrl(["status", str(tmp_path / "old")], REPO, job_env())
    assert result.returncode == 1, output_of(result)
    # one run's view (key/value rows): why it is stale is its problem row
    rows = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())
    assert rows["state"] == "STALE", result.stdout
    assert f"the scheduler's job {job_id} is another job" in rows["problem"], result.stdout
    # The same id with the job's own submit time (and cluster) is that job.
    own = job_record(tmp_path / "own", job_id, iso(int(real["submit"]) + 1), real["cluster"])
    assert (query_status(own).state, query_status(own).exit_code) == ("COMPLETED", 0)
    # ... unless it was submitted on another cluster: not this job. Seconds after the submit
    # that is no news yet (sacct may lag a new job); later STALE (test_job_identity.py).
    elsewhere = attrs.evolve(own, slurm_cluster=f"not-{real['cluster']}")
    assert query_status(elsewhere).state == "UNKNOWN"


def test_a_requeued_jobs_rows_are_its_own_attempts(tmp_path: Path) -> None:
    job_id = sbatch(tmp_path, "sleep 60", "--requeue")
    try:
        deadline = time.monotonic() + 60
        while run_slurm("squeue", "-h", "-j", job_id, "-o", "%T").strip() != "RUNNING":
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.5)
        run_slurm("scontrol", "requeue", job_id)
        wait_sacct_states(job_id, ["REQUEUED", "PENDING"])
        real = sacct_row(job_id)  # the first attempt's submit time
        record = job_record(tmp_path / "run", job_id, iso(int(real["submit"])), real["cluster"])
        status = query_status(record)
        # The second row's Submit is the requeue's time, yet it is this job's second attempt.
        assert (status.state, status.attempts) == ("PENDING", 2), json.dumps(attrs.asdict(status))
    finally:
        run_slurm("scancel", job_id, check=False)
