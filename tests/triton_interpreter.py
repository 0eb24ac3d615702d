"""Run a check of a test module with Triton's CPU interpreter (``TRITON_INTERPRET=1``).

Triton decides at import whether its own library functions (``tl.sum``, ``tl.max``) run
interpreted, and other tests of a session may import it first: each check runs in a fresh
interpreter process with ``TRITON_INTERPRET=1`` set before any import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_interpreted(module: str, check: str, *args: str) -> None:
    """``module.check(*args)`` (``module``: a dotted test module name) in a child process whose
    Triton kernels run in the CPU interpreter; its assertion errors fail the calling test with
    the child's traceback."""
    code = f"import sys; import {module} as t; getattr(t, {check!r})(*sys.argv[1:])"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
