"""``<run_dir>/job.json``: what ``hpcrl status/logs/cancel`` need to find a submitted job again.

Written once at submission. Everything else (state, attempts, exit code) is read live from
the scheduler (sacct) or from submitit's files, so this record never goes stale.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Literal

import attrs

from hpcrl.files import write_file

JOB_RECORD_NAME = "job.json"
JOB_RECORD_SCHEMA = 1


@attrs.frozen(kw_only=True)
class JobRecord:
    """One submitted job (or one array task of a sweep).

    job_id: the scheduler's id as submitit spells it: ``123``, ``123_4`` (array task 4), or
    the controller's pid for the local executor. submitit_folder: submitit's folder (pickles,
    results, per-task logs). num_tasks: tasks of the job (one per node).
    """

    executor: Literal["slurm", "local"]
    job_id: str
    job_name: str
    cluster: str
    submitit_folder: str
    num_tasks: int
    submitted_at: str  # ISO 8601, UTC
    max_requeues: int
    array_index: int | None = None  # sweeps: this point's array index
    sweep_dir: str | None = None
    schema: int = JOB_RECORD_SCHEMA

    @property
    def array_job_id(self) -> str:
        """The id without the array index (what sacct and scancel accept for the whole job)."""
        return self.job_id.split("_", 1)[0]


class RunFolderError(RuntimeError):
    """A folder given to status/logs/cancel/report is not a (submitted) run folder."""


def utc_now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_job_record(run_dir: Path, record: JobRecord) -> Path:
    # atomic: a concurrent `hpcrl status` never reads half a file
    text = json.dumps(attrs.asdict(record), indent=2, sort_keys=True) + "\n"
    return write_file(Path(run_dir) / JOB_RECORD_NAME, text)


def read_job_record(run_dir: Path) -> JobRecord:
    """The record of ``run_dir``; RunFolderError (saying why) when there is none."""
    path = Path(run_dir) / JOB_RECORD_NAME
    if not Path(run_dir).is_dir():
        raise RunFolderError(f"{run_dir}: no such run folder")
    if not path.is_file():
        raise RunFolderError(
            f"{run_dir}: no {JOB_RECORD_NAME} (rendered but never submitted? "
            f"submit it with: hpcrl submit ...)"
        )
    data = json.loads(path.read_text())
    if data.get("schema") != JOB_RECORD_SCHEMA:
        raise RunFolderError(f"{path}: schema {data.get('schema')!r}, expected {JOB_RECORD_SCHEMA}")
    fields = {field.name for field in attrs.fields(JobRecord)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise RunFolderError(f"{path}: unknown keys {unknown}")
    return JobRecord(**data)
