"""``hpcrl logs -f`` while sacct fails (issue 26): sacct's own error is shown at once, not
after the five minutes the follow waits before it gives up, and following goes on; when sacct
answers again, that is said too. sacct is a stand-in script here (tests/robust/harness.py):
"fails" must happen on demand and must never touch the shared cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs

from hpcrl.cli.main import main
from hpcrl.submit import waiting
from tests.robust.harness import short_waits, write_scheduler_standins

RECORD = {
    "executor": "slurm", "job_id": "4242", "job_name": "x", "cluster": "c", "num_tasks": 2,
    "submitted_at": "2026-11-29T10:00:00+00:00", "max_requeues": 0, "array_index": None,
    "sweep_dir": None, "schema": 1,
}  # fmt: skip
SACCT_ERROR = "sacct exited 1: sacct: error: Slurm accounting storage is disabled"
#: Fails twice, then says the job completed.
RECOVERING_SACCT = """#!{python}
# stand-in for sacct (tests/submit/test_follow_when_sacct_fails.py)
import pathlib, sys
calls = pathlib.Path(__file__).with_name("calls")
count = int(calls.read_text()) if calls.exists() else 0
calls.write_text(str(count + 1))
if count < 2:
    sys.exit("sacct: error: Slurm accounting storage is disabled")
args = sys.argv[1:]
fields = args[args.index("-o") + 1].split(",")
print("|".join(fields))
row = {{"JobID": "4242", "State": "COMPLETED", "ExitCode": "0:0"}}
print("|".join(row.get(field, "") for field in fields))
"""


def follow(
    tmp_path: Path, monkeypatch, capsys, sacct: str, grace_s: float | None = None
) -> tuple[int, list[str]]:
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.json").write_text(json.dumps({**RECORD, "submitit_folder": str(run / "submitit")}))
    standins = write_scheduler_standins(tmp_path / "bin", "fail")
    if sacct == "recovering":
        (standins / "sacct").write_text(RECOVERING_SACCT.format(python=sys.executable))
    monkeypatch.setenv("PATH", f"{standins}:/usr/bin:/bin")
    short_waits(monkeypatch.setattr)
    if grace_s is not None:  # sacct is asked again on submitit's backoff: 2 s, then 4 s
        settings = attrs.evolve(waiting.default_wait_settings(), unreachable_grace_s=grace_s)
        monkeypatch.setattr(waiting, "default_wait_settings", lambda: settings)
    code = main(["logs", "-f", str(run)])
    return code, capsys.readouterr().err.splitlines()


def test_a_failing_sacct_is_said_at_once_and_following_goes_on(tmp_path, monkeypatch, capsys):
    code, lines = follow(tmp_path, monkeypatch, capsys, "fail")
    assert lines[0] == (
        f"hpcrl logs: the scheduler is not answering ({SACCT_ERROR}); still following, asking "
        "again (giving up after 1 s without an answer)"
    )
    assert lines[-1] == (
        "hpcrl logs: job 4242 the scheduler has not answered for a while; the job may still run"
    )
    assert len(lines) == 2 and code == 1  # said once, not once per poll


def test_sacct_answering_again_is_said(tmp_path, monkeypatch, capsys):
    code, lines = follow(tmp_path, monkeypatch, capsys, "recovering", grace_s=60.0)
    assert lines[0].startswith(f"hpcrl logs: the scheduler is not answering ({SACCT_ERROR})")
    assert "hpcrl logs: the scheduler answers again" in lines
    assert lines[-1] == "hpcrl logs: job 4242 completed" and code == 0
