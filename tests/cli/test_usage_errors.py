"""Arguments no run can satisfy are usage errors (issue 26): exit 2 with the fix, as argparse's
own, instead of an empty listing with exit 0."""

from __future__ import annotations

import pytest

from hpcrl.cli.main import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("status", "--state", "EXPLODED"),
         "hpcrl status: error: --state EXPLODED: not a run state (fix: one or more of BOOT_FAIL, "
         "CANCELLED, COMPLETED, COMPLETING, DEADLINE, FAILED, LOST, NODE_FAIL, NOT_SUBMITTED, "
         "OUT_OF_MEMORY, PENDING, PREEMPTED, PREEMPTED_FINAL, REQUEUED, REQUEUE_FED, "
         "REQUEUE_HOLD, RESIZING, REVOKED, RUNNING, SIGNALING, SPECIAL_EXIT, STAGE_OUT, STALE, "
         "STOPPED, SUSPENDED, TIMEOUT, UNKNOWN, UNREACHABLE (any case, comma-separated))"),
        (("status", "--runs-dir", "/nonexistent"),
         "hpcrl status: error: --runs-dir /nonexistent: no such folder (fix: give the folder "
         "that holds your run folders (runs/ where you submitted), or name runs themselves: "
         "hpcrl status RUN ...)"),
        (("status", "--runs-dir", "/dev/null"),
         "hpcrl status: error: --runs-dir /dev/null: not a folder (fix: give the folder that "
         "holds your run folders (runs/ where you submitted), or name runs themselves: hpcrl "
         "status RUN ...)"),
        (("logs", "--attempt", "99999999999999999999", "/nonexistent/run"),
         "hpcrl logs: error: --attempt 99999999999999999999: attempts count from 1 to at most "
         "65,536 (a job's first run and each of its requeues; Slurm counts requeues in 16 "
         "bits) (fix: e.g. --attempt 1, or leave --attempt out for all)"),
        (("logs", "--attempt", "0", "/nonexistent/run"),
         "hpcrl logs: error: --attempt 0: attempts count from 1 to at most 65,536 (a job's "
         "first run and each of its requeues; Slurm counts requeues in 16 bits) (fix: e.g. "
         "--attempt 1, or leave --attempt out for all)"),
    ],
    ids=["state", "runs-dir-missing", "runs-dir-file", "attempt-huge", "attempt-zero"],
)  # fmt: skip
def test_impossible_arguments_are_usage_errors(argv, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(list(argv)) == 2
    assert capsys.readouterr().err.strip() == said


def test_state_words_in_any_case_and_the_default_runs_folder_still_list(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # no runs/ here: an empty listing, not an error
    assert main(["status", "--state", "failed,Running"]) == 0
    assert main(["status"]) == 0
    assert capsys.readouterr().out.count("No runs") == 2
