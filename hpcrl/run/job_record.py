"""``<run_dir>/job.json``: what ``hpcrl status/logs/cancel`` need to find a submitted job again.

Written at submission (``hpcrl resume`` replaces it with the new job's, naming the earlier
ones). Everything else (state, attempts, exit code) is read live from the scheduler (sacct)
or from submitit's files. Job ids repeat (a Slurm cluster whose ids began again at 1, a
reused pid), so a job is known by its id *and* its submit time and cluster
(``hpcrl.submit.job_state``): a scheduler record that does not match is another job's.
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs

from hpcrl.config.errors import UserError
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.run.atomic_files import write_file

JOB_RECORD_NAME = "job.json"
JOB_RECORD_SCHEMA = 1
MAX_RECORD_BYTES = 1 << 20
MAX_TASKS = 100_000
SLURM_JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")
LOCAL_JOB_ID = re.compile(r"[0-9]+")  # the local controller's pid
LIST_RUNS_FIX = (
    "give a run folder that hpcrl submit printed (hpcrl status lists those under ./runs)"
)
DAMAGED_FIX = (
    "the record of the job is damaged: restore it, or remove the run folder (its job may "
    "still run: squeue --me lists yours)"
)


@attrs.frozen(kw_only=True)
class JobRecord(SharedMethods):
    """One submitted job (or one array task of a sweep).

    job_id: the scheduler's id as submitit spells it: ``123``, ``123_4`` (array task 4), or
    the controller's pid for the local executor. submitit_folder: submitit's folder (pickles,
    results, per-task logs). num_tasks: tasks of the job (one per node). slurm_cluster:
    Slurm's ClusterName at submission (None: unknown, or local). attempt_offset: attempts the
    run's earlier jobs made; earlier_job_ids: those jobs (``hpcrl resume``), oldest first.
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
    slurm_cluster: str | None = None
    attempt_offset: int = 0
    earlier_job_ids: tuple[str, ...] = ()
    schema: int = JOB_RECORD_SCHEMA

    @property
    def array_job_id(self) -> str:
        """The id without the array index (what sacct and scancel accept for the whole job)."""
        return self.job_id.split("_", 1)[0]


class RunFolderError(UserError):
    """A folder given to status/logs/cancel/report is not a (submitted) run folder.

    ``short``: two or three words for the status table (``not submitted``, ``bad job.json``).
    """

    def __init__(self, message: str, fix: str = "", short: str = "not a run"):
        super().__init__(message, fix)
        self.short = short


def utc_now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_job_record(run_dir: Path, record: JobRecord) -> Path:
    # atomic: a concurrent `hpcrl status` never reads half a file
    text = json.dumps(attrs.asdict(record), indent=2, sort_keys=True) + "\n"
    return write_file(Path(run_dir) / JOB_RECORD_NAME, text)


#: A run folder whose submission failed says so here (when, and sbatch's answer); removed
#: when a later submission of the folder goes through.
SUBMIT_FAILURE_NAME = "submit_failed.json"


def write_submit_failure(run_dir: Path, message: str) -> None:
    text = json.dumps({"at": utc_now_iso(), "error": message}, indent=2) + "\n"
    write_file(Path(run_dir) / SUBMIT_FAILURE_NAME, text)


def clear_submit_failure(run_dir: Path) -> None:
    (Path(run_dir) / SUBMIT_FAILURE_NAME).unlink(missing_ok=True)


def read_submit_failure(run_dir: Path) -> str | None:
    """``<error> (<time>)`` of the folder's last failed submission, None when there was none
    (or its note cannot be read)."""

    def unreadable(message: str, fix: str) -> UserError:
        return UserError(message, fix)

    try:
        data = read_json_file(Path(run_dir) / SUBMIT_FAILURE_NAME, unreadable, "")
    except UserError:
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("at", "error")):
        return None
    return f"{data['error']} ({data['at']})"


def read_job_record(run_dir: Path) -> JobRecord:
    """The record of ``run_dir``; RunFolderError (saying why, and the fix) when there is none
    or it cannot be read."""
    run_dir = Path(run_dir)
    path = run_dir / JOB_RECORD_NAME
    if not run_dir.is_dir():
        what = "not a folder" if run_dir.exists() else "no such run folder"
        raise RunFolderError(f"{run_dir}: {what}", fix=LIST_RUNS_FIX, short="no run folder")
    if not path.exists() and not path.is_symlink():
        raise RunFolderError(
            f"{run_dir}: rendered but never submitted (no {JOB_RECORD_NAME})",
            fix=submit_fix(run_dir),
            short="not submitted",
        )

    def damaged(message: str, fix: str) -> RunFolderError:
        return RunFolderError(message, fix, short="bad job.json")

    data = read_json_file(path, damaged, DAMAGED_FIX)
    return _structure_record(path, data)


def read_json_file(path: Path, error_class: Callable[[str, str], UserError], fix: str) -> Any:
    """A small JSON file hpcrl wrote, or an ``error_class(message, fix)`` saying why it cannot
    be read (never blocks on a FIFO or device, never reads a huge file whole)."""
    if not path.is_file():
        raise error_class(f"{path}: not a regular file", fix)
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_RECORD_BYTES + 1)
    except OSError as error:
        raise error_class(f"{path}: cannot be read: {error.strerror or error}", fix) from None
    if len(raw) > MAX_RECORD_BYTES:
        raise error_class(f"{path}: larger than {MAX_RECORD_BYTES} bytes; not hpcrl's", fix)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise error_class(f"{path}: not UTF-8 text (damaged)", fix) from None
    except (json.JSONDecodeError, RecursionError) as error:
        what = "empty" if not raw.strip() else f"not valid JSON ({error})"
        raise error_class(f"{path}: {what}", fix) from None


def _structure_record(path: Path, data: Any) -> JobRecord:
    def damaged(reason: str) -> RunFolderError:
        return RunFolderError(f"{path}: {reason}", fix=DAMAGED_FIX, short="bad job.json")

    if not isinstance(data, dict):
        raise damaged("expected a JSON object of the job's fields")
    if data.get("schema") != JOB_RECORD_SCHEMA:
        raise damaged(f"schema {data.get('schema')!r}, expected {JOB_RECORD_SCHEMA}")
    from hpcrl.config.converter import try_structure  # strict: no coercion, unknown keys named

    record, issues = try_structure(data, JobRecord)
    if record is None:
        raise damaged("; ".join(f"{i.problem.path}: {i.problem.message}" for i in issues[:3]))
    reason = _record_problem(record)
    if reason:
        raise damaged(reason)
    return record


def _record_problem(record: JobRecord) -> str | None:
    job_id_form = LOCAL_JOB_ID if record.executor == "local" else SLURM_JOB_ID
    if not job_id_form.fullmatch(record.job_id):
        return f"job_id {record.job_id!r} is not a {record.executor} job id"
    if not 1 <= record.num_tasks <= MAX_TASKS:
        return f"num_tasks {record.num_tasks} is not a task count (1..{MAX_TASKS})"
    if not record.submitit_folder:
        return "submitit_folder is empty"
    if record.attempt_offset < 0:
        return f"attempt_offset {record.attempt_offset} is negative"
    for job_id in record.earlier_job_ids:
        if not job_id_form.fullmatch(job_id):
            return f"earlier_job_ids: {job_id!r} is not a {record.executor} job id"
    try:
        datetime.datetime.fromisoformat(record.submitted_at)
    except ValueError:
        return f"submitted_at {record.submitted_at!r} is not an ISO 8601 time"
    return None


def submit_fix(run_dir: Path) -> str:
    """The command that submits a rendered run folder, from its manifest where it can."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
        written_by = manifest.get("plan", {}).get("written_by") or []
        if written_by[1:2] == ["rerun"]:  # its recipe is the earlier run's: rerun it here
            argv = [*written_by, *([] if "-o" in written_by else ["-o", str(run_dir)])]
            if all(isinstance(arg, str) for arg in argv):
                return f"submit it with: {shlex.join(argv)}"
        cluster = manifest.get("profile_source") or manifest["profile"]
        argv = ["hpcrl", "submit", manifest["recipe_source"], "--cluster", cluster]
        argv += [*manifest.get("overrides", []), "-o", str(run_dir)]
        if all(isinstance(arg, str) for arg in argv):
            return f"submit it with: {shlex.join(argv)}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return "submit it with: hpcrl submit RECIPE --cluster PROFILE -o " + shlex.quote(str(run_dir))
