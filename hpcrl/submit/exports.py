"""A run's checkpoints and its Hugging Face exports, as ``hpcrl export``/``status``/``report``
see them from the run folder alone (login side: nothing here imports torch).

Two kinds of exports exist:
- ``checkpointing.save_consolidated: true``: the job writes ``<checkpoint>/hf`` beside each
  checkpoint it saves (pruned with it by ``keep_top_k``);
- ``hpcrl export RUN``: a folder per export (default ``RUN/exports/step_<N>``), recorded in
  ``RUN/exports/exports.jsonl`` (step, folder, export job) when it starts.
Either folder is complete once it holds ``hpcrl_export.json`` (written last, then the folder
is renamed from ``.partial``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import attrs

from hpcrl.config.errors import UserError
from hpcrl.plan.export_job import EXPORTS_DIR_NAME
from hpcrl.run.checkpoints import (
    CONSOLIDATED_SUBDIR,
    EXPORT_RECORD,
    METRICS_INDEX,
    checkpoint_folder,
    complete_checkpoints,
)
from hpcrl.submit.hints import command

if TYPE_CHECKING:
    from hpcrl.run.jobspec import JobSpec

INDEX_NAME = "exports.jsonl"


class ExportRefused(UserError):
    """``hpcrl export`` cannot do what was asked; the message says why, the fix what to do."""

    exit_code = 2


@attrs.frozen(kw_only=True)
class RunCheckpoints:
    folder: Path  # checkpointing.checkpoint_dir, else RUN/checkpoints
    found: tuple[tuple[int, Path], ...]  # complete checkpoints, oldest first
    enabled: bool
    metric: str | None  # checkpointing.metric_name as a step-record key
    higher_is_better: bool


@attrs.frozen(kw_only=True)
class ExportEntry:
    """One Hugging Face folder of a run (for ``status``/``report``)."""

    step: int
    path: Path
    by: Literal["checkpointing.save_consolidated", "hpcrl export"]
    complete: bool
    job_id: str | None = None  # the export job that writes it (hpcrl export on Slurm)


def run_plan(run_dir: Path) -> JobSpec:
    """The run's plan (``jobspec.json``): the Python, code and recipe its job ran with."""
    from hpcrl.run.jobspec_file import JobSpecError, JobSpecMissing, read_jobspec

    if not run_dir.is_dir():
        raise ExportRefused(
            f"{run_dir} does not exist", "name a run folder (hpcrl status lists them)"
        )
    try:
        return read_jobspec(run_dir)
    except JobSpecMissing:
        raise ExportRefused(
            f"{run_dir}: no jobspec.json: not an hpcrl run folder (or one never rendered)",
            "name a run folder (hpcrl status lists them)",
        ) from None
    except JobSpecError as error:
        raise ExportRefused(
            f"{run_dir}: its plan cannot be read, so the Python and code its job ran are "
            f"unknown: {error}",
            "export with the hpcrl that submitted the run",
        ) from None


def run_checkpoints(run_dir: Path) -> RunCheckpoints:
    """The run's checkpoints as its job saved them: where, which, ranked by what (by the
    recipe of its plan, which the job read; not ``recipe.resolved.yaml``)."""
    from hpcrl.config.checkpoint_metrics import record_key

    recipe = run_plan(run_dir).recipe
    cfg = recipe.checkpointing
    folder = checkpoint_folder(cfg.checkpoint_dir, run_dir)
    return RunCheckpoints(
        folder=folder, found=tuple(complete_checkpoints(folder)), enabled=cfg.enabled,
        metric=record_key(recipe.algorithm, cfg.metric_name) if cfg.metric_name else None,
        higher_is_better=cfg.higher_is_better,
    )  # fmt: skip


def pick_checkpoint(run_dir: Path, step: int | None, best: bool) -> tuple[int, Path]:
    """(step, folder): step ``step``, the best by ``checkpointing.metric_name``, or the newest."""
    checkpoints = run_checkpoints(run_dir)
    if not checkpoints.found:
        why = "" if checkpoints.enabled else " (checkpointing.enabled is false)"
        raise ExportRefused(
            f"{run_dir}: no complete checkpoint in {checkpoints.folder}{why}: nothing to export",
            "train with checkpointing.enabled=true (the last step is always saved): "
            f"{command('rerun', run_dir, 'checkpointing.enabled=true')}",
        )
    by_step = dict(checkpoints.found)
    steps = ", ".join(str(s) for s in by_step)
    if step is not None:
        if step not in by_step:
            raise ExportRefused(
                f"{run_dir}: no complete checkpoint of step {step} in {checkpoints.folder}",
                f"pick one of the steps saved: {steps}",
            )
        return step, by_step[step]
    if best:
        return _best_checkpoint(checkpoints, steps)
    return checkpoints.found[-1]


def _best_checkpoint(checkpoints: RunCheckpoints, steps: str) -> tuple[int, Path]:
    if checkpoints.metric is None:
        raise ExportRefused(
            "--best needs checkpointing.metric_name in the run's recipe (it names the metric "
            "checkpoints are ranked by); this run has none",
            f"pick a step with --step N (saved: {steps})",
        )
    index_path = checkpoints.folder / METRICS_INDEX
    values = json.loads(index_path.read_text()) if index_path.is_file() else {}
    sign = 1.0 if checkpoints.higher_is_better else -1.0
    # best value first, then the newer step (as the checkpoint store ranks them)
    ranked = [(sign * float(values[str(s)]), s) for s, _ in checkpoints.found
              if isinstance(values.get(str(s)), int | float)]  # fmt: skip
    if not ranked:
        raise ExportRefused(
            f"no saved checkpoint has a value of {checkpoints.metric} ({index_path})",
            f"pick a step with --step N (saved: {steps})",
        )
    step = max(ranked)[1]
    return step, dict(checkpoints.found)[step]


def exports_dir(run_dir: Path) -> Path:
    return run_dir / EXPORTS_DIR_NAME


def record_export(run_dir: Path, step: int, out_dir: Path, job_id: str | None) -> None:
    """One line in ``RUN/exports/exports.jsonl`` when an export starts."""
    folder = exports_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    line = {"step": step, "path": str(out_dir), "job_id": job_id}
    with open(folder / INDEX_NAME, "a") as index:
        index.write(json.dumps(line, sort_keys=True) + "\n")


def is_complete_export(folder: Path) -> bool:
    return (folder / EXPORT_RECORD).is_file()


def list_exports(run_dir: Path) -> list[ExportEntry]:
    """Every export of the run, by step: the job's ``hf`` folders, then hpcrl export's (the
    latest record per folder); an unreadable recipe or index lists what it can."""
    entries: list[ExportEntry] = []
    try:
        found = run_checkpoints(run_dir).found
    except (UserError, OSError, ValueError):  # ExportRefused is one
        found = ()
    for step, checkpoint in found:
        folder = checkpoint / CONSOLIDATED_SUBDIR
        if is_complete_export(folder):
            entries.append(ExportEntry(
                step=step, path=folder, by="checkpointing.save_consolidated", complete=True
            ))  # fmt: skip
    latest: dict[str, ExportEntry] = {}
    for line in _index_lines(run_dir):
        path = Path(line["path"])
        latest[str(path)] = ExportEntry(
            step=int(line["step"]), path=path, by="hpcrl export",
            complete=is_complete_export(path), job_id=line.get("job_id"),
        )  # fmt: skip
    entries += latest.values()
    return sorted(entries, key=lambda entry: (entry.step, entry.by))


def _index_lines(run_dir: Path) -> list[dict]:
    path = exports_dir(run_dir) / INDEX_NAME
    try:
        text = path.read_text()
    except OSError:
        return []
    lines = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and isinstance(line.get("path"), str):
            if isinstance(line.get("step"), int):
                lines.append(line)
    return lines


def describe_export(entry: ExportEntry) -> str:
    """One line for status/report: ``step 4: PATH (hpcrl export)``."""
    state = (
        ""
        if entry.complete
        else (f", being written by export job {entry.job_id}" if entry.job_id else ", not complete")
    )
    return f"step {entry.step}: {entry.path} ({entry.by}{state})"
