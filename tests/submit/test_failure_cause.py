"""One line for ``hpcrl status``, ``submit --wait`` and ``logs``: why a job failed (or an
attempt ended early), when it says so: the cause records node 0 writes (hpcrl.run.causes), the
nodes' failure reports, the task logs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import attrs
import pytest
from rich.console import Console

from hpcrl.run.causes import (
    AttemptCause,
    last_step,
    latest_cause,
    read_cause,
    read_causes,
    write_cause,
)
from hpcrl.run.job_record import JobRecord
from hpcrl.submit.job_state import failure_cause
from hpcrl.submit.job_status import JobStatus
from hpcrl.submit.log_view import attempt_cause_lines
from hpcrl.submit.logs import fold_state_dumps
from hpcrl.submit.status_view import status_cause
from hpcrl.submit.waiting import _announce_requeues

LOST = AttemptCause(
    attempt=0, kind="node_lost", what="node 1 (n2) lost", detail="its Ray exited (raylet killed "
    "by signal 9)", after_step=3, exit_code=1, requeued=True, log="logs/node1/attempt0/ray.out",
)  # fmt: skip
KILLED = AttemptCause(
    attempt=1, kind="driver_killed", what="driver killed by signal 9 (SIGKILL: out of memory?)",
    after_step=5, exit_code=137, log="logs/node0/attempt1/driver.log",
)  # fmt: skip


def write_marker(
    run_dir: Path, node: int, written: float, message: str, attempt: str = "7.0"
) -> None:
    (run_dir / "status").mkdir(exist_ok=True)
    (run_dir / "status" / f"node{node}.failed").write_text(
        json.dumps({"attempt": attempt, "time": written, "message": message})
    )


def test_one_line_per_cause() -> None:
    assert LOST.titled_line() == (
        "attempt 1: node 1 (n2) lost after step 3: its Ray exited (raylet killed by signal 9); "
        "exit code 1; requeued, the next attempt resumes from the last checkpoint "
        "(log: logs/node1/attempt0/ray.out)"
    )
    assert KILLED.line() == (
        "driver killed by signal 9 (SIGKILL: out of memory?) after step 5; exit code 137 "
        "(log: logs/node0/attempt1/driver.log)"
    )
    assert LOST.retryable and not KILLED.retryable


def test_records_round_trip_and_unreadable_ones_are_left_out(tmp_path: Path) -> None:
    assert read_causes(tmp_path) == [] and latest_cause(tmp_path) is None
    write_cause(tmp_path, KILLED)
    write_cause(tmp_path, LOST)
    assert read_causes(tmp_path) == [LOST, KILLED] and latest_cause(tmp_path) == KILLED
    assert read_cause(tmp_path, 0) == LOST and read_cause(tmp_path, 2) is None
    status = tmp_path / "status"
    for name, text in [
        ("cause.2.json", "{not json"), ("cause.3.json", "[1, 2]"), ("cause.4.json", b"\xff\xfe"),
        ("cause.5.json", json.dumps({"attempt": "5", "kind": "x", "what": "y"})),
        ("cause.6.json", json.dumps({"attempt": 6, "kind": "x", "what": "y", "requeued": 1})),
        ("cause.7.json", json.dumps({"attempt": -1, "kind": "x", "what": "y"})),
    ]:  # fmt: skip
        (status / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    assert read_causes(tmp_path) == [LOST, KILLED]


def test_a_secret_in_a_cause_is_hidden_before_it_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz123456")
    leaky = AttemptCause(attempt=0, kind="driver_raised", what="driver raised KeyError",
                         detail="hf_abcdefghijklmnopqrstuvwxyz123456")  # fmt: skip
    write_cause(tmp_path, leaky)
    text = (tmp_path / "status" / "cause.0.json").read_text()
    assert "hf_abcdefghijklmnopqrstuvwxyz123456" not in text and "hidden" in text


def test_the_last_step_a_run_recorded(tmp_path: Path) -> None:
    assert last_step(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "val_loss": 1.0}\n')
    assert last_step(tmp_path) is None  # the validation before step 1 is no step
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1}\n{"step": 2}\nnot json\n{"step": true}\n{"step": 3, "lo'
    )
    assert last_step(tmp_path) == 2  # a line cut short is still being written


def test_node_0s_record_wins_over_its_attempts_node_reports_not_over_a_later_one(tmp_path):
    write_marker(tmp_path, 1, 100.0, "Ray on node n2 exited ...", attempt="7.0")
    write_cause(tmp_path, LOST)
    assert failure_cause(tmp_path) == LOST.line()
    write_marker(tmp_path, 0, 200.0, "preflight on node 0 (n1): ray is missing", attempt="7.1")
    assert failure_cause(tmp_path) == "preflight on node 0 (n1): ray is missing"
    write_cause(tmp_path, KILLED)
    assert failure_cause(tmp_path) == KILLED.line()


@pytest.mark.parametrize(
    ("status", "shown"),
    [
        (JobStatus(state="FAILED", attempts=2), f"attempt 2: {KILLED.line()}"),
        (JobStatus(state="FAILED", attempts=1), KILLED.line()),
        (JobStatus(state="RUNNING", attempts=2), None),  # attempt 2's own: not ended yet
        (JobStatus(state="COMPLETED", attempts=3), KILLED.titled_line()),
    ],
)
def test_the_status_cause_cell(tmp_path: Path, status: JobStatus, shown: str) -> None:
    write_cause(tmp_path, LOST)
    write_cause(tmp_path, KILLED)
    assert status_cause(tmp_path, status) == shown
    assert status_cause(tmp_path / "none", JobStatus(state="RUNNING", attempts=2)) is None


def test_logs_and_wait_name_each_attempts_end(tmp_path: Path) -> None:
    write_cause(tmp_path, LOST)
    write_cause(tmp_path, KILLED)
    assert attempt_cause_lines(tmp_path) == [LOST.titled_line(), KILLED.titled_line()]
    assert attempt_cause_lines(tmp_path, attempt=2) == [KILLED.titled_line()]
    record = JobRecord(
        executor="slurm", job_id="41", job_name="j", cluster="c", submitit_folder="x",
        num_tasks=2, submitted_at="2026-11-29T10:00:00+00:00", max_requeues=1,
    )  # fmt: skip
    console = Console(file=io.StringIO(), width=400)
    announced: set[tuple[int, int]] = set()
    for _ in range(2):  # each poll of --wait
        _announce_requeues([(tmp_path, record)], announced, console)
    # once, and only the requeued one: the job's end is reported with its outcome
    assert console.file.getvalue().splitlines() == [f"job 41 {LOST.titled_line()}"]


def test_rays_state_dumps_are_folded_into_one_line() -> None:
    text = (
        "step 3/8  reward 0.1\n"
        "(raylet) Raylet is terminated. Last 20 lines of the Raylet logs:\n"
        + "    [state-dump] \tNodeManager.deadline_timer - 1 total\n" * 30
        + "    [2026-12-01 20:37:26,893 I 23661 23661] (raylet) accessor.cc:475: notification\n"
        + "\x1b[33m(raylet)\x1b[0m [state-dump] DebugString() time ms: 0\n"
    )
    assert fold_state_dumps(text, Path("logs/driver.log")) == (
        "step 3/8  reward 0.1\n"
        "(raylet) Raylet is terminated. Last 20 lines of the Raylet logs:\n"
        "    [hpcrl: 30 lines of Ray's state dump left out; they are in logs/driver.log]\n"
        "    [2026-12-01 20:37:26,893 I 23661 23661] (raylet) accessor.cc:475: notification\n"
        "    [hpcrl: 1 lines of Ray's state dump left out; they are in logs/driver.log]\n"
    )


def test_the_newest_node_failure_first_line(tmp_path):
    assert failure_cause(tmp_path) is None
    write_marker(tmp_path, 1, 100.0, "node 1 (n2) failed: head unreachable")
    write_marker(tmp_path, 0, 200.0, "preflight on node 0 (n1): ray is missing\nmore detail")
    assert failure_cause(tmp_path) == "preflight on node 0 (n1): ray is missing"


def test_an_import_failure_before_hpcrl_ran(tmp_path):
    """code: installed with a Python that lacks submitit fails before any hpcrl code: the
    task's log is all there is."""
    (tmp_path / "submitit").mkdir()
    (tmp_path / "submitit" / "41_0_log.err").write_text(
        "Traceback (most recent call last):\n  File ...\n"
        "ModuleNotFoundError: No module named 'submitit'\n"
    )
    cause = failure_cause(tmp_path)
    assert cause is not None and cause.startswith(
        "the job's Python could not import: No module named 'submitit'"
    )
    assert "code: bundle" in cause
    write_marker(tmp_path, 0, 1.0, "preflight on node 0 (n1): torch is missing")
    assert failure_cause(tmp_path) == "preflight on node 0 (n1): torch is missing"


def _node_failed_run(run: Path) -> JobRecord:
    """Task 0's log and node logs as a job leaves them when Slurm ended attempt 2 NODE_FAIL
    (tests/submit/test_slurm_faults.py makes the real one)."""
    (run / "submitit").mkdir(parents=True)
    (run / "submitit" / "41_0_log.err").write_text(
        "===== hpcrl attempt 1 · job 41 · node 0 (n1) · 2026-12-02T00:00:00+00:00 =====\n"
        "srun: error: Node failure on n1\n"  # (not this attempt's)
        "===== hpcrl attempt 2 · job 41 · node 0 (n1) · 2026-12-02T00:01:00+00:00 =====\n"
        "srun: error: Node failure on n2\n"
        "slurmstepd-n1: error: *** STEP 41.0 ON n1 CANCELLED AT 2026-12-02T00:01:40 DUE TO "
        "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
    )
    for rank, name in enumerate(("n1", "n2")):
        log = run / "logs" / f"node{rank}" / "attempt1" / "node.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"2026-12-02 00:01:01.000 node{rank} INFO node {rank} of 2 ({name}, "
                       f"10.77.0.1{rank + 1}), job 41 attempt 1, Ray temp dir /tmp/r\n")  # fmt: skip
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    return JobRecord(
        executor="slurm", job_id="41", job_name="j", cluster="c",
        submitit_folder=str(run / "submitit"), num_tasks=2,
        submitted_at="2026-12-02T00:00:00+00:00", max_requeues=3,
    )  # fmt: skip


NODE_FAIL_LINE = (
    "node 1 (n2) lost after step 3: its slurmd stopped answering (Slurm marked the node DOWN "
    "and ended the attempt NODE_FAIL){}(log: submitit/41_0_log.err)"
)


def test_an_attempt_slurm_ended_node_fail_is_named_from_srun_before_any_record(tmp_path):
    from hpcrl.submit.failure_causes import attempt_causes, failure_account

    record = _node_failed_run(tmp_path)
    pending = JobStatus(state="PENDING", attempts=3, states=("REQUEUED", "NODE_FAIL", "PENDING"))
    (cause,) = attempt_causes(tmp_path, record, pending)
    requeued = NODE_FAIL_LINE.format(
        "; requeued, the next attempt resumes from the last checkpoint "
    )
    assert cause.titled_line() == f"attempt 2: {requeued}"
    assert status_cause(tmp_path, pending, record=record) == f"attempt 2: {requeued}"
    # not requeued (no requeues left): the job's end, exit code 1
    ended = JobStatus(state="NODE_FAIL", attempts=2, exit_code=0, states=("REQUEUED", "NODE_FAIL"))
    assert failure_account(tmp_path, record, ended) == (NODE_FAIL_LINE.format(" "), 1)
    # the next attempt's node 0 wrote the record: it wins
    write_cause(tmp_path, attrs.evolve(cause, after_step=2))
    (recorded,) = attempt_causes(tmp_path, record, pending)
    assert recorded.after_step == 2
    # an attempt whose part of the task log names no node failure: no invented cause
    (tmp_path / "status" / "cause.1.json").unlink()
    err_log = tmp_path / "submitit" / "41_0_log.err"
    err_log.write_text(err_log.read_text().replace("Node failure on n2", "Job step aborted"))
    assert attempt_causes(tmp_path, record, pending) == []


def test_a_node_that_failed_first_gives_its_exit_code_not_sruns_15(tmp_path):
    """Node 1's preflight fails first and srun ends node 0's task (no result of it): sacct
    says 15 (the batch step's), the job's code is the failing node's 1, with its line."""
    from hpcrl.submit.job_state import read_outcome
    from hpcrl.submit.status_view import _cause_and_exit_code

    line = "preflight on node 1 (n2): ray is missing (every job needs ray>=2.49,<2.61)"
    write_marker(tmp_path, 1, 100.0, line, attempt="41.0")
    record = JobRecord(
        executor="slurm", job_id="41", job_name="j", cluster="c",
        submitit_folder=str(tmp_path / "submitit"), num_tasks=2,
        submitted_at="2026-12-02T00:00:00+00:00", max_requeues=1,
    )  # fmt: skip
    failed = JobStatus(state="FAILED", attempts=1, exit_code=15, states=("FAILED",))
    outcome = read_outcome(record, tmp_path, failed)
    assert (outcome.exit_code, outcome.detail, outcome.has_result) == (1, line, False)
    assert _cause_and_exit_code(tmp_path, failed, 0, record) == (line, 1)
    # nothing named: sacct's code stands
    assert read_outcome(record, tmp_path / "none", failed).exit_code == 15
