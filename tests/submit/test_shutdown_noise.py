"""A cancelled job's logs end with one line saying it was cancelled (issue 26 item 7); its
shutdown noise (Ray's C++ SIGTERM stack dumps, the autoscaler's traceback, srun's and
slurmstepd's lines, a local task's KeyboardInterrupt traceback) is left out unless --raw.
The log texts below are what a two-node GRPO job on the test cluster and a local job left
when cancelled (2026-12-03), trimmed to their ends."""

from __future__ import annotations

import io
import json
from pathlib import Path

import attrs

from hpcrl.run.job_record import JobRecord, write_job_record
from hpcrl.submit.log_view import LoggedRun, LogSelection, print_logs
from hpcrl.submit.shutdown_noise import (
    Cancellation,
    cancellation_of,
    without_shutdown_noise,
    write_cancel_note,
)

BANNER = "===== hpcrl attempt 1 · job 14 · node 0 (n1) · 2026-12-03T23:32:24+00:00 =====\n"
STDERR = (
    BANNER
    + """\
2026-12-03 23:32:24.627 node0 INFO started Ray head and driver hpcrl.core.driver:run_training
srun: got SIGCONT
submitit WARNING (2026-12-03 23:33:39,326) - Bypassing signal SIGCONT
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
slurmstepd-n1: error: *** JOB 14 ON n1 CANCELLED AT 2026-12-03T23:33:39 ***
srun: forcing job termination
slurmstepd-n1: error: *** STEP 14.0 ON n1 CANCELLED AT 2026-12-03T23:33:39 ***
submitit WARNING (2026-12-03 23:33:39,355) - Bypassing signal SIGTERM
srun: error: n1: task 0: Killed
srun: launch/slurm: _step_signal: Terminating StepId=14.0
"""
)
DRIVER_LOG = """\
step 22/32  reward 0.967±0.048  loss 0.0019
step 23/32  reward 0.973±0.047  loss 0.0241
*** SIGTERM received at time=1796340819 on cpu 1 ***
PC: @     0x7f9f096a3f16  (unknown)  (unknown)
    @     0x7f9f0965a050  (unknown)  (unknown)
[2026-12-03 23:33:39,367 E 15571 15571] logging.cc:474: *** SIGTERM received at time=1796340819 on cpu 1 ***
[2026-12-03 23:33:39,368 E 15571 15571] logging.cc:474: PC: @     0x7f9f096a3f16  (unknown)  (unknown)
\x1b[33m(raylet)\x1b[0m The autoscaler failed with the following error:
Terminated with signal 15
  File "/venv/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py", line 463, in _run
    time.sleep(AUTOSCALER_UPDATE_INTERVAL_S)

[2026-12-03 23:33:39,416 E 15571 16299] core_worker.cc:609: :info_message: Attempting to recover 4 lost objects
"""
LOCAL_STDERR = (
    BANNER.replace("job 14", "job 14001")
    + """\
2026-12-03 23:31:49.279 node0 INFO driver exited with code 0
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/submitit/core/submission.py", line 55, in process_job
    result = delayed.result()
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/subprocess.py", line 2040, in _wait
    time.sleep(delay)
KeyboardInterrupt
"""
)


def _run(tmp_path: Path, executor: str = "slurm", job_id: str = "14") -> LoggedRun:
    record = JobRecord(
        executor=executor, job_id=job_id, job_name="j", cluster="c",  # type: ignore[arg-type]
        submitit_folder=str(tmp_path / "submitit"), num_tasks=1,
        submitted_at="2026-12-03T23:32:22+00:00", max_requeues=0,
    )  # fmt: skip
    write_job_record(tmp_path, record)
    (tmp_path / "submitit").mkdir()
    (tmp_path / "submitit" / f"{job_id}_0_log.out").write_text("")
    return LoggedRun(run_dir=tmp_path, record=record)


def _logs(run: LoggedRun, **selection: object) -> list[str]:
    stream = io.StringIO()
    print_logs([run], LogSelection(**selection), stream)  # type: ignore[arg-type]
    return stream.getvalue().splitlines()


def test_a_job_cancelled_with_scancel_ends_with_one_line(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (tmp_path / "submitit" / "14_0_log.err").write_text(STDERR)
    (tmp_path / "logs" / "node0" / "attempt0").mkdir(parents=True)
    (tmp_path / "logs" / "node0" / "attempt0" / "driver.log").write_text(DRIVER_LOG)
    assert _logs(run) == [
        f"[node0 stderr] {BANNER.strip()}",
        "[node0 stderr] 2026-12-03 23:32:24.627 node0 INFO started Ray head and driver "
        "hpcrl.core.driver:run_training",
        "[node0 attempt1 driver.log] step 22/32  reward 0.967±0.048  loss 0.0019",
        "[node0 attempt1 driver.log] step 23/32  reward 0.973±0.047  loss 0.0241",
        "[hpcrl] job 14 was cancelled at 2026-12-03T23:33:39; 20 line(s) of shutdown output "
        "left out (hpcrl logs --raw shows them)",
    ]
    raw = _logs(run, raw=True)
    assert len(raw) == 4 + 20 and "[hpcrl]" not in "".join(raw)
    assert "[node0 attempt1 driver.log] *** SIGTERM received at time=1796340819 on cpu 1 ***" in raw


def test_hpcrl_cancel_notes_who_and_when_and_a_local_tasks_interrupt_is_left_out(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path, executor="local", job_id="14001")
    (tmp_path / "submitit" / "14001_0_log.err").write_text(LOCAL_STDERR)
    write_cancel_note(tmp_path, run.record, attempt=1)
    note = json.loads((tmp_path / "cancelled.json").read_text())
    assert set(note) == {"job_id", "attempt", "by", "at"} and note["job_id"] == "14001"
    lines = _logs(run)
    assert lines[-2:] == [
        "[node0 stderr] 2026-12-03 23:31:49.279 node0 INFO driver exited with code 0",
        f"[hpcrl] job 14001 was cancelled at {cancellation_of(tmp_path, run.record, ()).at} by "
        f"{note['by']} (hpcrl cancel); 7 line(s) of shutdown output left out (hpcrl logs --raw "
        "shows them)",
    ]
    assert "KeyboardInterrupt" not in "\n".join(lines)
    assert _logs(run, raw=True)[-1] == "[node0 stderr] KeyboardInterrupt"


def test_only_the_cancelled_attempts_noise_goes_and_a_time_limit_is_no_cancel(
    tmp_path: Path,
) -> None:
    second = BANNER.replace("attempt 1", "attempt 2")
    requeued = (
        BANNER
        + "step 3\nsubmitit WARNING (x) - Bypassing signal SIGTERM\n"
        + second
        + "step 4\n*** SIGTERM received at time=1 on cpu 0 ***\n"
    )
    text, hidden = without_shutdown_noise(requeued, first_attempt=1, cancelled=2)
    assert (
        text
        == BANNER
        + "step 3\nsubmitit WARNING (x) - Bypassing signal SIGTERM\n"
        + second
        + "step 4\n"
    )
    assert hidden == 1
    run = _run(tmp_path)
    timeout = "slurmstepd-n1: error: *** JOB 14 ON n1 CANCELLED AT 2026-12-03T23:33:39 DUE TO TIME LIMIT ***\n"
    assert cancellation_of(tmp_path, run.record, [BANNER + timeout]) is None
    assert cancellation_of(tmp_path, run.record, [STDERR]) == Cancellation(
        job_id="14", attempt=1, at="2026-12-03T23:33:39"
    )
    write_cancel_note(tmp_path, attrs.evolve(run.record, job_id="13"), 1)
    assert cancellation_of(tmp_path, run.record, ()) is None  # an earlier job's note
