"""One line for ``hpcrl status`` and ``submit --wait``: why a job failed, when it says so."""

from __future__ import annotations

import json
from pathlib import Path

from hpcrl.submit.job_state import failure_cause


def write_marker(run_dir: Path, node: int, written: float, message: str) -> None:
    (run_dir / "status").mkdir(exist_ok=True)
    (run_dir / "status" / f"node{node}.failed").write_text(
        json.dumps({"attempt": "7.0", "time": written, "message": message})
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
