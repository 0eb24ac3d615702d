"""Submit a planned, rendered job (or job array) through submitit and record it.

The rendered script is what runs: the Slurm executor returns it from submitit's script hook,
and refuses when the script's task command is not the one submitit would run.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import submitit
from submitit.core import utils as submitit_utils

from hpcrl.config.errors import UserError
from hpcrl.job.node_task import NodeTask
from hpcrl.run.job_record import (
    JobRecord,
    clear_submit_failure,
    utc_now_iso,
    write_job_record,
    write_submit_failure,
)
from hpcrl.run.jobspec import JobSpec
from hpcrl.submit.executor import (
    RenderedLocalExecutor,
    RenderedSlurmExecutor,
    time_limit_to_min,
)

DEFAULT_LOCAL_TIME_LIMIT = "01:00:00"
SCONTROL_TIMEOUT_S = 10.0


class SubmissionRefused(UserError):
    """The scheduler refused the job (sbatch's own message, and the script that was refused),
    or there is no scheduler to submit to. ``summary``: one line for ``hpcrl status``."""

    def __init__(self, message: str, fix: str = "", summary: str = ""):
        super().__init__(message, fix)
        self.summary = summary or message.splitlines()[0]


NO_SLURM_FIX = (
    "submit from a login node of the cluster (sbatch and srun on PATH), or use a profile "
    "with scheduler: local"
)


#: How long sbatch may take to answer before hpcrl stops waiting (``$HPCRL_SBATCH_TIMEOUT_S``).
SBATCH_TIMEOUT_VARIABLE = "HPCRL_SBATCH_TIMEOUT_S"
DEFAULT_SBATCH_TIMEOUT_S = 120.0
#: coreutils' ``timeout``: the limit passed (124), or sbatch ignored the TERM and was killed (137).
TIMED_OUT_CODES = frozenset({124, 137})


def sbatch_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """``$HPCRL_SBATCH_TIMEOUT_S`` (seconds, > 0), else ``DEFAULT_SBATCH_TIMEOUT_S``."""
    text = (os.environ if environ is None else environ).get(SBATCH_TIMEOUT_VARIABLE, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_SBATCH_TIMEOUT_S
    return value if 0 < value < float("inf") else DEFAULT_SBATCH_TIMEOUT_S


@contextlib.contextmanager
def _refusal_explained(script_path: Path, job_name: str = "") -> Iterator[None]:
    """sbatch's failures as SubmissionRefused; submitit's own copy of sbatch's error output
    (printed to stderr before it raises) is kept out of the terminal: the message has it."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    except submitit_utils.FailedJobError as error:  # what submitit raises when sbatch fails
        code = getattr(error.__cause__, "returncode", None)
        if code in TIMED_OUT_CODES:
            raise _timed_out(script_path, job_name) from None
        said = str(error).strip()
        raise SubmissionRefused(
            f"sbatch refused {script_path}:\n{said}\n"
            "Fix the cluster profile (partition, account, qos, time limit) and run the same "
            "command again: the run folder is reused.",
            summary=f"sbatch refused it: {said.splitlines()[-1] if said else '(no message)'}",
        ) from None
    except OSError as error:  # sbatch itself missing or not runnable
        raise SubmissionRefused(
            f"cannot run sbatch: {error.strerror or error}", NO_SLURM_FIX
        ) from None
    except RuntimeError as error:
        if "srun" not in str(error):
            raise
        # submitit's SlurmExecutor looks for srun before anything else
        raise SubmissionRefused("no Slurm here: srun is not on PATH", NO_SLURM_FIX) from None


def _timed_out(script_path: Path, job_name: str) -> SubmissionRefused:
    limit_s = sbatch_timeout_s()
    return SubmissionRefused(
        f"sbatch did not answer within {limit_s:g} s ({shlex.join(['sbatch', str(script_path)])}"
        "): the Slurm controller is overloaded or down; the job may have been queued anyway",
        fix=f"check with squeue --me --name {shlex.quote(job_name or 'JOB_NAME')} before running "
        f"the same command again (it reuses the run folder); {SBATCH_TIMEOUT_VARIABLE}=SECONDS "
        "waits longer",
        summary=f"sbatch did not answer within {limit_s:g} s (the job may have been queued anyway)",
    )


#: What ``hpcrl submit`` leaves of a submission that failed: none of it is a job's.
SUBMISSION_LEFTOVER = re.compile(r"\.submission_file_[0-9a-f]{32}\.sh|[0-9a-f]{32}\.pkl")


def remove_submission_leftovers(submitit_folder: Path) -> None:
    """The files submitit wrote before sbatch failed (the script copy, the pickled task);
    the submitit folder itself when nothing else is in it."""
    try:
        entries = list(os.scandir(submitit_folder))
    except OSError:
        return
    for entry in entries:
        if SUBMISSION_LEFTOVER.fullmatch(entry.name):
            Path(entry.path).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        submitit_folder.rmdir()  # only when empty


@contextlib.contextmanager
def _failure_recorded(jobspec: JobSpec, run_dirs: Sequence[Path]) -> Iterator[None]:
    """A refused submission leaves the folders as rendered, each saying why it was not
    submitted (``submit_failed.json``); a submission that goes through clears that."""
    try:
        yield
    except SubmissionRefused as error:
        remove_submission_leftovers(Path(jobspec.submitit_folder))
        for run_dir in run_dirs:
            write_submit_failure(run_dir, error.summary)
        raise
    for run_dir in run_dirs:
        clear_submit_failure(run_dir)


def jobspec_time_limit_min(jobspec: JobSpec) -> int:
    directives = dict(jobspec.sbatch_directives)
    return time_limit_to_min(directives.get("time") or DEFAULT_LOCAL_TIME_LIMIT)


def build_executor(jobspec: JobSpec, script_path: Path) -> submitit.Executor:
    """The executor that submits the script ``hpcrl render`` wrote at ``script_path``."""
    time_limit_min = jobspec_time_limit_min(jobspec)
    if jobspec.scheduler == "local":
        return RenderedLocalExecutor(
            jobspec.submitit_folder,
            script_path=script_path,
            task_command=jobspec.task_command,
            python=jobspec.python_command,
            time_limit_min=time_limit_min,
            max_requeues=jobspec.max_requeues,
            visible_gpus=jobspec.visible_gpus or (),
        )
    return RenderedSlurmExecutor(
        jobspec.submitit_folder,
        script_text=Path(script_path).read_text(),
        task_command=jobspec.task_command,
        python=jobspec.python_command,
        num_nodes=jobspec.num_nodes,
        tasks_per_node=1,
        time_limit_min=time_limit_min,
        max_requeues=jobspec.max_requeues,
        array_size=jobspec.array_size,
        sbatch_timeout_s=sbatch_timeout_s(),
    )


def slurm_cluster_name(timeout_s: float = SCONTROL_TIMEOUT_S) -> str | None:
    """Slurm's ClusterName (``scontrol show config``), recorded with each job so that a record
    is never matched to a job of another cluster; None when scontrol cannot say."""
    try:
        proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                              errors="replace", timeout=timeout_s, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName" and value.strip():
            return value.strip()
    return None


def _record(jobspec: JobSpec, job: submitit.Job[Any], **extra: Any) -> JobRecord:
    return JobRecord(
        executor="local" if jobspec.scheduler == "local" else "slurm",
        job_id=str(job.job_id),
        job_name=jobspec.job_name,
        cluster=jobspec.profile_name,
        submitit_folder=str(Path(jobspec.submitit_folder).absolute()),
        num_tasks=jobspec.num_nodes if jobspec.scheduler == "slurm" else 1,
        submitted_at=utc_now_iso(),
        max_requeues=jobspec.max_requeues,
        **extra,
    )


#: submitit's local controller outlives `hpcrl submit`; its own output goes here.
LOCAL_CONTROLLER_LOG = "local_controller.log"


@contextlib.contextmanager
def _stdio_into(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` while submitit starts its local controller.

    The controller inherits them and runs until the job ends: inheriting the terminal's (or
    a pipe's) descriptors would keep ``hpcrl submit | tee`` open until then.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def submit_job(
    jobspec: JobSpec, script_path: Path, attempt_offset: int = 0, **record_fields: Any
) -> JobRecord:
    """Submit one run (its run folder is already rendered) and write ``<run_dir>/job.json``.

    ``attempt_offset``: attempts of the run's earlier jobs (``hpcrl resume``): the job numbers
    its attempts after them. ``record_fields``: more JobRecord fields (a local sweep's point:
    array_index, sweep_dir; a resumed run: earlier_job_ids)."""
    assert jobspec.array_size is None, "arrays go through submit_array"
    task = NodeTask(attempt_offset=attempt_offset)
    run_dir = Path(jobspec.run_dir)
    with _failure_recorded(jobspec, [run_dir]):
        with _refusal_explained(script_path, jobspec.job_name):
            executor = build_executor(jobspec, script_path)
        if jobspec.scheduler == "local":
            with _stdio_into(Path(jobspec.submitit_folder) / LOCAL_CONTROLLER_LOG):
                job = executor.submit(task, jobspec.run_dir)
        else:
            with _refusal_explained(script_path, jobspec.job_name):
                job = executor.submit(task, jobspec.run_dir)
            record_fields.setdefault("slurm_cluster", slurm_cluster_name())
    record = _record(jobspec, job, attempt_offset=attempt_offset, **record_fields)
    write_job_record(run_dir, record)
    return record


def submit_array(
    jobspec: JobSpec, script_path: Path, point_run_dirs: Sequence[Path]
) -> list[JobRecord]:
    """Submit a sweep as one job array (task i runs point i) and write each point's job.json."""
    assert jobspec.array_size == len(point_run_dirs), "one array task per point"
    folders = [Path(jobspec.run_dir), *map(Path, point_run_dirs)]
    with _failure_recorded(jobspec, folders), _refusal_explained(script_path, jobspec.job_name):
        executor = build_executor(jobspec, script_path)
        jobs = executor.map_array(NodeTask(), [str(run_dir) for run_dir in point_run_dirs])
    records = []
    cluster = slurm_cluster_name()
    for index, (job, run_dir) in enumerate(zip(jobs, point_run_dirs, strict=True)):
        record = _record(
            jobspec, job, array_index=index, sweep_dir=jobspec.run_dir, slurm_cluster=cluster
        )
        write_job_record(Path(run_dir), record)
        records.append(record)
    return records
