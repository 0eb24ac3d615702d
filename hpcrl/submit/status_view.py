"""``hpcrl status``: one ``RunStatus`` per run (per sweep point), from run folders and one
scheduler query; shown as a table or, with ``--json``, as a list of objects for scripts.

A run folder is listed when it holds ``job.json`` (submitted), ``manifest.json`` (rendered,
never submitted: state ``NOT_SUBMITTED``) or ``sweep.json`` (a sweep: its points).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcrl.run.job_record import (
    JobRecord,
    RunFolderError,
    read_job_record,
    read_submit_failure,
)
from hpcrl.run.metrics_file import finite_number, last_metrics
from hpcrl.run.sweep_record import SweepError, is_sweep_dir, read_sweep_record
from hpcrl.submit.failure_causes import attempt_causes, failure_account
from hpcrl.submit.job_state import query_statuses
from hpcrl.submit.job_status import JobStatus

NOT_SUBMITTED = "NOT_SUBMITTED"
#: States in which a job's named failure (its cause record, a node's report) is worth showing.
_NOT_FAILED = frozenset({"PENDING", "RUNNING", "COMPLETED", "UNKNOWN", "REQUEUED", "SUSPENDED"})
AGE = re.compile(r"(?P<number>[0-9]+)(?P<unit>[smhdw])")
AGE_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@attrs.frozen(kw_only=True)
class ListedRun:
    """A folder to show: its name in the table, path, and the values of a sweep point."""

    name: str
    path: Path
    swept: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RunStatus:
    """What ``hpcrl status`` says about one run (None: not known, or not recorded)."""

    name: str
    path: str
    state: str  # sacct's state word, NOT_SUBMITTED, or a problem ("bad job.json")
    job_id: str | None = None
    exit_code: int | None = None
    attempts: int | None = None
    pending_reason: str | None = None
    step: int | None = None
    max_steps: int | None = None
    reward: float | None = None
    loss: float | None = None
    elapsed_s: float | None = None
    recipe: str | None = None
    submitted_at: str | None = None
    swept: dict[str, str] = attrs.field(factory=dict)
    cause: str | None = None  # why it failed, or why an earlier attempt ended (status_cause)
    out_of_gpu_memory: bool = False  # failed because a worker ran out of GPU memory
    scheduler_error: str | None = None
    problem: str | None = None  # why the folder could not be read, with the fix


def parse_age(text: str) -> float:
    """``30m``, ``2h``, ``1d``, ``1w`` (or combined, ``1h30m``) as seconds; ValueError else."""
    text = text.strip()
    matches = list(AGE.finditer(text))
    if not text or "".join(m.group(0) for m in matches) != text:
        raise ValueError(f"{text!r} is not an age like 30m, 2h, 1d or 1w")
    return float(sum(int(m["number"]) * AGE_UNIT_S[m["unit"]] for m in matches))


def collect_run_dirs(paths: Sequence[Path], runs_dir: Path) -> list[ListedRun]:
    """The given folders, or every run under ``runs_dir``; a sweep folder stands for its
    points (an unreadable sweep for itself: its row says why), a folder of runs for the runs
    in it. A given folder that does not
    exist is an error (RunFolderError), not a row."""
    for path in paths:
        if not path.exists():
            raise RunFolderError(f"{path}: no such run folder",
                                 fix="give a run folder that hpcrl submit printed (hpcrl status "
                                 "without folders lists those under ./runs)")  # fmt: skip
    if not paths:
        paths = _runs_in(runs_dir)
    else:  # a folder of runs given (hpcrl status runs/, ~/old-runs) stands for its runs
        paths = [run for path in paths for run in (_runs_in(path) if _holds_runs(path) else [path])]
    found = []
    for path in paths:
        try:
            points = read_sweep_record(path).points if is_sweep_dir(path) else None
        except SweepError:
            points = None
        if points is None:
            found.append(ListedRun(name=path.name or str(path), path=path))
        else:
            found += [
                ListedRun(
                    name=f"{path.name}/{p.run_dir_name}",
                    path=path / p.run_dir_name,
                    swept=dict(p.values),
                )  # fmt: skip
                for p in points
            ]
    return found


def _is_run(path: Path) -> bool:
    return any((path / name).exists() for name in ("job.json", "manifest.json"))


def _runs_in(folder: Path) -> list[Path]:
    """The run and sweep folders directly inside ``folder``, by name."""
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if _is_run(path) or is_sweep_dir(path))


def _holds_runs(path: Path) -> bool:
    """A folder that is no run or sweep itself but has some inside."""
    return not _is_run(path) and not is_sweep_dir(path) and bool(_runs_in(path))


def _manifest(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolved_recipe(run_dir: Path) -> dict[str, Any]:
    """The run's ``recipe.resolved.yaml`` as a dict ({} when it cannot be read)."""
    import yaml

    try:
        recipe = yaml.safe_load((Path(run_dir) / "recipe.resolved.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return recipe if isinstance(recipe, dict) else {}


def planned_max_steps(run_dir: Path) -> int | None:
    """``grpo.max_num_steps`` (or ``sft.``) of the run's resolved recipe."""
    recipe = resolved_recipe(run_dir)
    for section in ("grpo", "sft"):
        block = recipe.get(section)
        steps = block.get("max_num_steps") if isinstance(block, dict) else None
        if isinstance(steps, int) and not isinstance(steps, bool):
            return steps
    return None


def _metrics_fields(run_dir: Path) -> dict[str, Any]:
    metrics = last_metrics(run_dir) or {}
    step = metrics.get("step")
    return {
        "step": step if isinstance(step, int) else None,
        "reward": finite_number(metrics.get("reward_mean")),
        "loss": finite_number(metrics.get("loss")),
    }


def run_statuses(listed: Sequence[ListedRun]) -> list[RunStatus]:
    """One status per listed run; one scheduler query answers for all of them."""
    records: dict[int, JobRecord] = {}
    early: dict[int, RunStatus] = {}
    for index, run in enumerate(listed):
        base = _base_status(run)
        try:
            if is_sweep_dir(run.path):  # listed as itself: its sweep.json is unreadable
                read_sweep_record(run.path)
            records[index] = read_job_record(run.path)
        except RunFolderError as error:
            if error.short == "not submitted":
                failed = read_submit_failure(run.path)  # why, when a submission was refused
                early[index] = attrs.evolve(
                    base, state=NOT_SUBMITTED, **_metrics_fields(run.path),
                    cause=failed,
                )  # fmt: skip
            else:
                early[index] = attrs.evolve(base, state=error.short, problem=error.one_line())
        except SweepError as error:
            early[index] = attrs.evolve(base, state="bad sweep.json", problem=error.one_line())
    answers = dict(zip(records, query_statuses(list(records.values())), strict=True))
    return [
        early[index] if index in early else _job_status(run, records[index], answers[index])
        for index, run in enumerate(listed)
    ]


def _base_status(run: ListedRun) -> RunStatus:
    manifest = _manifest(run.path)
    recipe = manifest.get("recipe_source")
    return RunStatus(
        name=run.name, path=str(run.path), state="", swept=run.swept,
        recipe=recipe if isinstance(recipe, str) else None,
        max_steps=planned_max_steps(run.path),
    )  # fmt: skip


def status_cause(
    run_dir: Path, status: JobStatus, attempt_offset: int = 0, record: JobRecord | None = None
) -> str | None:
    """The cause cell: why a failed job failed (its newest attempt, ``failure_account``); for a
    job that goes on or completed after a requeue, why its previous attempt ended
    (``hpcrl.run.causes``: ``attempt 1: node 1 (n2) lost after step 3: ...; requeued, ...``).
    ``attempt_offset``: attempts of the run's jobs before ``hpcrl resume`` (attempts are
    counted through the run); a STALE record has no cause of its own (its problem line).
    With ``record``, an attempt Slurm ended NODE_FAIL is named before any node wrote why."""
    return _cause_and_exit_code(run_dir, status, attempt_offset, record)[0]


def _cause_and_exit_code(
    run_dir: Path, status: JobStatus, attempt_offset: int, record: JobRecord | None
) -> tuple[str | None, int | None]:
    """The cause cell and the exit code to show: a failed job's named failure's own code
    (sacct's is srun's 15 when another node failed first), else sacct's."""
    if status.stale is not None:
        return None, status.exit_code
    attempts = attempt_offset + status.attempts
    if status.state not in _NOT_FAILED:
        account = failure_account(run_dir, record, status)
        if account is None:
            return None, status.exit_code
        line, exit_code = account
        return (f"attempt {attempts}: {line}" if attempts > 1 else line), exit_code
    causes = attempt_causes(run_dir, record, status)
    cause = causes[-1] if causes else None
    current = attempts - 1 + int(status.state == "REQUEUED")
    if cause is None or cause.attempt >= current:
        return None, status.exit_code  # none, or the current attempt's own (sacct lags)
    return cause.titled_line(), status.exit_code


def _job_status(run: ListedRun, record: JobRecord, status: JobStatus) -> RunStatus:
    cause, exit_code = _cause_and_exit_code(run.path, status, record.attempt_offset, record)
    return attrs.evolve(
        _base_status(run), state=status.state, job_id=record.job_id, exit_code=exit_code,
        # a resumed run's earlier jobs' attempts count (job.json's attempt_offset)
        attempts=record.attempt_offset + status.attempts, pending_reason=status.reason,
        elapsed_s=status.elapsed_s, problem=status.stale,
        submitted_at=record.submitted_at, cause=cause, scheduler_error=status.scheduler_error,
        out_of_gpu_memory=status.state == "FAILED" and _ran_out_of_gpu_memory(run.path),
        **_metrics_fields(run.path),
    )  # fmt: skip


def _ran_out_of_gpu_memory(run_dir: Path) -> bool:
    from hpcrl.run.causes import GPU_OOM, latest_cause

    cause = latest_cause(run_dir)
    return cause is not None and cause.kind == GPU_OOM


# --------------------------------------------------------------------------- filters
@attrs.frozen(kw_only=True)
class StatusFilter:
    """Keep runs in one of ``states`` (words, any case), whose recipe contains ``recipe``,
    submitted (rendered) at most ``max_age_s`` ago."""

    states: frozenset[str] = frozenset()
    recipe: str | None = None
    max_age_s: float | None = None

    def keeps(self, run: RunStatus, now: datetime.datetime) -> bool:
        if self.states and run.state.upper() not in self.states:
            return False
        if self.recipe is not None and self.recipe not in (run.recipe or ""):
            return False
        if self.max_age_s is not None:
            started = _started_at(run)
            return started is not None and (now - started).total_seconds() <= self.max_age_s
        return True


def _started_at(run: RunStatus) -> datetime.datetime | None:
    if run.submitted_at:
        try:
            return datetime.datetime.fromisoformat(run.submitted_at)
        except ValueError:
            return None
    try:  # rendered only: when the manifest was written
        mtime = (Path(run.path) / "manifest.json").stat().st_mtime
    except OSError:
        return None
    return datetime.datetime.fromtimestamp(mtime, datetime.UTC)


# --------------------------------------------------------------------------- table
def format_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def state_text(run: RunStatus) -> str:
    text = "not submitted" if run.state == NOT_SUBMITTED else run.state
    if run.out_of_gpu_memory:
        text += " (OOM)"
    if run.pending_reason:
        text += f" ({run.pending_reason})"
    if run.scheduler_error:
        text += " (scheduler not answering)"
    return text


def _step_text(run: RunStatus) -> str:
    if run.step is None:
        return ""
    return f"{run.step}/{run.max_steps}" if run.max_steps else str(run.step)


def table_columns(runs: Sequence[RunStatus]) -> list[str]:
    """The table's columns: ``values`` only with sweep points, ``cause`` only when a failed
    job named one, ``reward`` only when a run recorded one (SFT runs have none)."""
    columns = ["run", "job", "state", "exit", "attempts", "step"]
    if any(run.reward is not None for run in runs):
        columns.append("reward")
    columns += ["loss", "elapsed"]
    if any(run.swept for run in runs):
        columns.insert(1, "values")
    if any(run.cause for run in runs):
        columns.append("cause")
    return columns


def table_cells(run: RunStatus) -> dict[str, str]:
    return {
        "run": run.name,
        "values": ", ".join(
            f"{key.rsplit('.', 1)[-1]}={value}" for key, value in run.swept.items()
        ),
        "job": run.job_id or "",
        "state": state_text(run),
        "exit": "" if run.exit_code is None else str(run.exit_code),
        "attempts": "" if run.attempts is None else str(run.attempts),
        "step": _step_text(run),
        "reward": _number(run.reward),
        "loss": _number(run.loss),
        "elapsed": format_elapsed(run.elapsed_s),
        "cause": run.cause or "",
    }


def as_json(runs: Sequence[RunStatus]) -> str:
    """The statuses as a JSON list (every field of ``RunStatus``; null where unknown)."""
    return json.dumps([attrs.asdict(run) for run in runs], indent=2)
