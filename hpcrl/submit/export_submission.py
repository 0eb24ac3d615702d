"""Run an export: here, with the job's Python (a local run, or ``--here``), or as a one-node
Slurm job through submitit (``hpcrl.plan.export_job``).

Here: ``<job's python> [<bundle>/hpcrl_entry.py] -u -m hpcrl.core.export RUN CHECKPOINT OUT``
in a subprocess with the job's environment added (its ``HF_HOME``, ...), its output passed
through. On Slurm: the rendered script is submitted by ``RenderedSlurmExecutor`` with that
same command as the pickled callable (submitit's ``CommandFunction``), so ``hpcrl export
--wait``, sacct and the logs work as for a run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcrl.plan.export_job import ExportJob, export_argv
from hpcrl.run.jobspec import JobSpec
from hpcrl.submit.exports import ExportRefused

EXPORT_FAILED_EXIT_CODE = 1
WAIT_POLL_S = 5.0


def job_environment(run: JobSpec, environ: dict[str, str] | None = None) -> dict[str, str]:
    """This shell's environment plus the job's literal variables (as its script exports)."""
    merged = dict(os.environ if environ is None else environ)
    merged.update(run.env)
    return merged


def check_runnable_here(run: JobSpec) -> None:
    """The job's Python must exist here: a container's lives in its image."""
    if run.container is not None:
        raise ExportRefused(
            f"the run's Python lives in its container image ({run.container.image}), which only "
            "a Slurm job step can enter",
            "leave out --here: hpcrl export then submits a one-node export job with the run's "
            "image, mounts and environment",
        )
    program = run.code.python[0]
    if shutil.which(program) is None:
        raise ExportRefused(
            f"the run's Python {program} does not exist on this machine",
            "run hpcrl export where that Python exists (a node of the cluster), or leave out "
            "--here to submit an export job",
        )


def export_here(run: JobSpec, checkpoint_dir: Path, out_dir: Path) -> int:
    """Run the export in a subprocess with the job's Python; its exit code (0: written)."""
    check_runnable_here(run)
    argv = export_argv(run, str(checkpoint_dir), str(out_dir))
    return subprocess.run(argv, env=job_environment(run), check=False).returncode


def submit_export_job(job: ExportJob, script_path: Path) -> Any:
    """Submit the rendered export script; the submitit job."""
    from submitit.helpers import CommandFunction

    from hpcrl.submit.executor import RenderedSlurmExecutor, time_limit_to_min
    from hpcrl.submit.submission import (
        DEFAULT_LOCAL_TIME_LIMIT,
        _refusal_explained,
        sbatch_timeout_s,
    )

    Path(job.submitit_folder).mkdir(parents=True, exist_ok=True)
    time_limit = dict(job.sbatch_directives).get("time") or DEFAULT_LOCAL_TIME_LIMIT
    with _refusal_explained(script_path, job.job_name):
        executor = RenderedSlurmExecutor(
            job.submitit_folder, script_text=script_path.read_text(),
            task_command=job.task_command, python=job.python_command, num_nodes=1,
            tasks_per_node=1, time_limit_min=time_limit_to_min(time_limit), max_requeues=0,
            sbatch_timeout_s=sbatch_timeout_s(),
        )  # fmt: skip
        return executor.submit(CommandFunction(list(job.export_argv), verbose=True))


def wait_for_export(
    job: Any,
    out_dir: Path,
    say: Callable[[str], None],
    poll_s: float = WAIT_POLL_S,
) -> int:
    """Until the export job ends: 0 when the folder is complete, else 1 (the state and
    the log are said). Each new state is said, and while it runs each new phase the export
    writes to its log (reading, writing, with the time since it began)."""
    from hpcrl.run.export_progress import newest_progress
    from hpcrl.submit.exports import is_complete_export

    last_state, last_progress = None, None
    while not job.done():
        state = job.state
        if state != last_state and state != "UNKNOWN":  # sacct lags a fresh job by a second
            say(f"export job {job.job_id}: {state}")
            last_state = state
        progress = newest_progress(job.paths.stdout)
        if progress is not None and progress != last_progress:
            say(f"export job {job.job_id}: {progress}")
            last_progress = progress
        time.sleep(poll_s)
    if is_complete_export(out_dir):
        return 0
    say(f"export job {job.job_id} ended {job.state} without writing {out_dir}; its log: "
        f"{job.paths.stderr}")  # fmt: skip
    return EXPORT_FAILED_EXIT_CODE
