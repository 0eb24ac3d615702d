"""A node started with SIGINT ignored (from ``nohup ... &``) must still stop on a local cancel.

A local cancel interrupts the job's tasks with SIGINT. A process that inherits SIGINT
ignored keeps it ignored across exec, and Python then installs no KeyboardInterrupt
handler: without ``_make_interruptible`` the node entrypoint would sleep through the cancel
and leave Ray and the driver running.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.submit.jobs_harness import REPO

# The child: SIGINT ignored as a background shell leaves it, optionally made interruptible,
# then interrupted by itself; it reports whether the interrupt reached Python.
CHILD = """
import os, signal, sys, time
from hpcrl.job.node import _make_interruptible
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
if sys.argv[1] == "fix":
    _make_interruptible()
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)
    print("slept through SIGINT")
except KeyboardInterrupt:
    print("interrupted")
"""


def _run_child(mode: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_an_inherited_ignored_sigint_is_made_interruptible_again() -> None:
    assert _run_child("fix") == "interrupted"


def test_without_it_the_interrupt_is_lost() -> None:
    # The trap this guards against: if Python ever stops inheriting the ignore, this fails
    # and the fix can go.
    assert _run_child("nofix") == "slept through SIGINT"
