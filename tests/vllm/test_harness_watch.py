"""The worker watcher of tests/vllm/harness.py counts a forked child of a worker, which keeps
the worker's command line until it execs, as started by the worker, not as a second worker
(a GRPO test once counted 3 training workers for 2 on a loaded CI box)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.vllm.harness import WorkerProcesses

# The parent forks a child that never execs: both carry this command line.
FORKING_WORKER = (
    "import os, sys, time; pid = os.fork(); "
    "print(pid if pid else '', flush=True) if pid else None; time.sleep(30)"
)


def test_a_forked_child_of_a_worker_is_not_another_worker():
    worker = subprocess.Popen(
        [sys.executable, "-c", f"# FakeWorkerClass\n{FORKING_WORKER}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child_pid = int(worker.stdout.readline())
        time.sleep(0.2)  # let the child settle, as the watcher polls
        seen = WorkerProcesses(classes=("FakeWorkerClass",))
        seen.record(psutil)
        assert seen.workers == {worker.pid}
        assert child_pid in seen.started_by_workers
    finally:
        for process in psutil.Process(worker.pid).children(recursive=True):
            process.kill()
        worker.kill()
        worker.wait()
