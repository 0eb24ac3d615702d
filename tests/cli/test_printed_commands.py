"""Every command hpcrl prints for the user to run is one shell line that runs as printed: its
words shell-quoted (a run folder named ``runs/sw $(touch PWNED)`` stays a folder name), the
program named as the user invoked it (``.venv/bin/hpcrl``). Issue 26 item 10 and its
"Bad inputs" bullet on printed commands."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from hpcrl.cli.jobs import print_submitted
from hpcrl.cli.main import main
from hpcrl.run.job_record import JobRecord
from hpcrl.submit.hints import invoked_as
from hpcrl.submit.waiting import _detached, _Watch, default_wait_settings
from tests.plan.planning_inputs import isolate_from_user_profiles

HOSTILE = "runs/sw $(touch PWNED)"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")


def _record() -> JobRecord:
    return JobRecord(
        executor="slurm", job_id="41", job_name="x [bold]y", cluster="c",
        submitit_folder="/nowhere", num_tasks=1, submitted_at="2026-12-01T00:00:00+00:00",
        max_requeues=0,
    )  # fmt: skip


def _console() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, width=200, highlight=False), stream


def _argv_of(line: str, tmp_path: Path) -> list[str]:
    """The words a shell makes of ``line``, with the program swapped for ``printf`` (so the
    shell runs nothing else); PWNED would appear if the line held a command substitution."""
    program, _, rest = line.partition(" ")
    assert program == "hpcrl"
    result = subprocess.run(["bash", "-c", "printf '%s\\n' " + rest], cwd=tmp_path,
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert not (tmp_path / "PWNED").exists()
    return result.stdout.splitlines()


def test_submit_hints_are_quoted_and_run_as_printed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/x/main.py"])  # python -m: "hpcrl"
    console, stream = _console()
    print_submitted(console, _record(), tmp_path / HOSTILE)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "Submitted job 41 (x [bold]y, 1 node(s) on c)",
        "  run folder  'runs/sw $(touch PWNED)'",
        "  follow      hpcrl logs 'runs/sw $(touch PWNED)' -f",
        "  status      hpcrl status 'runs/sw $(touch PWNED)'",
        "  cancel      hpcrl cancel 'runs/sw $(touch PWNED)'",
    ]
    for line in lines[2:]:
        words = _argv_of(line.split(None, 1)[1], tmp_path)
        assert words[1] == HOSTILE


def test_the_detached_line_is_quoted(tmp_path):
    console, stream = _console()
    watch = _Watch(_record(), default_wait_settings())
    _detached([(tmp_path / HOSTILE, _record())], [watch], console)
    line = stream.getvalue().strip()
    assert line == (
        "detached: job 41 is still running; follow with: hpcrl logs 'runs/sw $(touch PWNED)' -f "
        "(or hpcrl status 'runs/sw $(touch PWNED)')"
    )


def test_a_sweep_lists_its_points_and_report_command_quoted(tmp_path, capsys):
    code = main(["sweep", "grpo-tiny-1n-cpu", "--cluster", "local", "--grid",
                 "grpo.seed=1,2", "-o", HOSTILE, "--no-submit"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[1:] == [
        "  'runs/sw $(touch PWNED)/point-0'  grpo.seed=1",
        "  'runs/sw $(touch PWNED)/point-1'  grpo.seed=2",
        "  report      hpcrl report 'runs/sw $(touch PWNED)'",
    ]
    assert _argv_of(lines[-1].split(None, 1)[1], tmp_path) == ["report", HOSTILE]


def test_hints_name_the_program_as_it_was_invoked(tmp_path, monkeypatch):
    """``.venv/bin/hpcrl submit ...`` without the venv on PATH: the hints say
    ``.venv/bin/hpcrl``, which runs; with it on PATH (or run as ``hpcrl``): ``hpcrl``."""
    program = tmp_path / ".venv" / "bin" / "hpcrl"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert invoked_as(".venv/bin/hpcrl") == ".venv/bin/hpcrl"
    monkeypatch.setattr(sys, "argv", [".venv/bin/hpcrl", "submit"])
    console, stream = _console()
    print_submitted(console, _record(), tmp_path / "runs" / "x")
    assert "  follow      .venv/bin/hpcrl logs runs/x -f" in stream.getvalue().splitlines()
    monkeypatch.setenv("PATH", f"{program.parent}:/usr/bin:/bin")
    assert invoked_as(".venv/bin/hpcrl") == "hpcrl"
    assert invoked_as(str(program)) == "hpcrl"
    spaced = tmp_path / "my tools" / "hpcrl"
    spaced.parent.mkdir()
    spaced.write_text("#!/bin/sh\n")
    spaced.chmod(0o755)
    assert invoked_as(str(spaced)) == str(spaced)  # not on PATH: quoted where it is printed
    monkeypatch.setattr(sys, "argv", [str(spaced)])
    console, stream = _console()
    print_submitted(console, _record(), tmp_path / "runs" / "x")
    assert f"  status      {shlex.quote(str(spaced))} status runs/x" in stream.getvalue()
