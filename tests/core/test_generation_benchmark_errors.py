"""``benchmarks/generation_throughput.py``: a failed row keeps a short error in its record
and leaves its whole traceback in the log (a CUDA fault's text does not say where it was);
the self-checks run in a process of their own, and one that dies is a failed check."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.generation_throughput import row_failed, self_checks_in_child

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "generation_throughput.py"


def failing_call():
    raise RuntimeError("CUDA error: an illegal memory access was encountered " + "x" * 400)


def test_a_failed_row_logs_where_it_failed(capsys):
    try:
        failing_call()
    except RuntimeError as error:
        record = row_failed("hpcrl", error)
    assert record == {"error": ("RuntimeError: CUDA error: an illegal memory access was "
                                "encountered " + "x" * 400)[:300]}  # fmt: skip
    log = capsys.readouterr().err
    assert log.startswith("row hpcrl failed:\nTraceback (most recent call last):\n")
    assert "in failing_call" in log


def test_the_self_checks_run_in_a_process_of_their_own(tmp_path):
    out = tmp_path / "run.json"
    argv = ["--tiny", "--rows", "hpcrl", "--batches", "4", "--json-out", str(out)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("self-check greedy: PASS") == 1
    assert done.stdout.count("self-check logprobs: PASS") == 1
    run = json.loads(out.read_text())
    assert set(run["checks"]) == {"greedy", "logprobs"}
    assert all(check["passed"] for check in run["checks"].values())
    ran_in = {check["pid"] for check in run["checks"].values()}
    assert len(ran_in) == 1 and run["pid"] not in ran_in  # one other process ran both
    assert run["rows"][0]["measured"]["hpcrl"]["tokens_per_s"] > 0


def test_a_self_check_process_that_dies_is_a_failed_check(capsys):
    checks, sync = self_checks_in_child(["--model", "no-such-model"])
    assert sync is None
    assert checks == {"process": {"passed": False, "error": "self-check process exited 2"}}
    assert "self-check: FAIL" in capsys.readouterr().out
