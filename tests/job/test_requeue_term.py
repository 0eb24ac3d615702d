"""Slurm's requeue SIGTERMs every process of the job step, the ``scontrol requeue`` that asked
for it included; once task 0 has agreed to a requeue, what it starts next ignores SIGTERM.

The Slurm side of it, on the real test cluster (a ``scontrol`` slowed after ``requeue`` so
the signal always lands before it exits): tests/submit/test_slurm_faults.py. Here: the
process boundary itself, in a Python of its own (the test must not change pytest's handlers).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.submit.jobs_harness import REPO

_TASK_0 = """
import subprocess, sys
from submitit.core.utils import DelayedSubmission
from hpcrl.job.node_task import NodeTask

class Entrypoint:
    def __call__(self, run_dir):
        return 0

    def checkpoint(self, run_dir):
        return DelayedSubmission(Entrypoint(), run_dir) if sys.argv[1] == "requeue" else None

resubmission = NodeTask(Entrypoint()).checkpoint("/run")
# what submitit runs after a resubmission (scontrol requeue), with Slurm's SIGTERM landing
ended = subprocess.run(["sh", "-c", "kill -TERM $$; echo requeued"], capture_output=True, text=True)
print(resubmission is not None, ended.returncode, ended.stdout.strip())
"""


@pytest.mark.parametrize(
    ("answer", "printed"),
    [("requeue", "True 0 requeued"), ("no requeue", "False -15")],
)
def test_after_agreeing_to_a_requeue_task_0s_scontrol_outlives_slurms_sigterm(
    answer: str, printed: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _TASK_0, answer], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == printed
