"""Where each metric logger of a run writes, said at job start and shown by ``hpcrl status
RUN`` and ``hpcrl report``.

The driver, once its loggers started, prints one line per logger into its log and writes them
to ``<run>/loggers.json`` (W&B: online with its run's URL, or offline with its folder and the
``wandb sync`` command; TensorBoard: its folder; MLflow: its tracking URI, experiment and run
id). Before a job has started, the login side says where they will write, from the resolved
recipe (``planned_destinations``). Part of the run-folder contract: the job writes it, the
login side reads it.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LOGGERS_FILE = "loggers.json"


def describe(entry: Mapping[str, Any]) -> str:
    """``wandb offline: <folder> (upload: wandb sync <folder>)``, ``wandb online: <url>``,
    ``tensorboard: <folder>``, ``mlflow: <uri> (experiment e, run r)``."""
    kind = entry.get("logger", "?")
    if kind == "wandb":
        if entry.get("mode") == "online" and entry.get("url"):
            return f"wandb online: {entry['url']}"
        folder = str(entry.get("folder", "?"))
        planned = " (online instead when the job has WANDB_API_KEY)" if entry.get("planned") else ""
        return f"wandb offline: {folder} (upload: wandb sync {shlex.quote(folder)}){planned}"
    if kind == "tensorboard":
        return f"tensorboard: {entry.get('folder', '?')}"
    if kind == "mlflow":
        details = [f"experiment {entry.get('experiment', '?')}"]
        if entry.get("run_id"):
            details.append(f"run {entry['run_id']}")
        return f"mlflow: {entry.get('uri', '?')} ({', '.join(details)})"
    return f"{kind}: {entry}"


def write_destinations(run_dir: Path, entries: Sequence[Mapping[str, Any]]) -> None:
    """``loggers.json`` of the run (atomically: a reader never sees half of it)."""
    path = Path(run_dir) / LOGGERS_FILE
    partial = path.with_name(f".{LOGGERS_FILE}.{os.getpid()}.tmp")
    partial.write_text(json.dumps([dict(entry) for entry in entries], indent=2) + "\n")
    partial.replace(path)


def read_destinations(run_dir: Path) -> list[dict[str, Any]] | None:
    """What the job's driver said (None: it has not started its loggers, or said nothing)."""
    try:
        entries = json.loads((Path(run_dir) / LOGGERS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entries, list):
        return None
    return [entry for entry in entries if isinstance(entry, dict)]


def planned_destinations(recipe: Mapping[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """From a resolved recipe (``logger:``), where its loggers will write; each ``planned``."""
    found_section = recipe.get("logger")
    section: Mapping[str, Any] = found_section if isinstance(found_section, dict) else {}
    log_dir = _below(run_dir, section.get("log_dir") or "logs")
    found: list[dict[str, Any]] = []
    if section.get("wandb_enabled"):
        found.append({"logger": "wandb", "mode": "offline", "folder": str(log_dir / "wandb"),
                      "planned": True})  # fmt: skip
    if section.get("tensorboard_enabled"):
        folder = (section.get("tensorboard") or {}).get("log_dir") or "tensorboard"
        found.append({"logger": "tensorboard", "folder": str(_below(log_dir, folder))})
    if section.get("mlflow_enabled"):
        mlflow = section.get("mlflow") or {}
        uri = mlflow.get("tracking_uri") or (log_dir / "mlruns").absolute().as_uri()
        found.append({"logger": "mlflow", "uri": uri,
                      "experiment": mlflow.get("experiment_name") or "hpcrl"})  # fmt: skip
    return found


def logger_lines(run_dir: Path, recipe: Mapping[str, Any]) -> list[str]:
    """One line per logger: what the job said, else what the recipe plans."""
    recorded = read_destinations(run_dir)
    entries = recorded if recorded is not None else planned_destinations(recipe, run_dir)
    return [describe(entry) for entry in entries]


def _below(base: Path, folder: str) -> Path:
    path = Path(os.path.expanduser(str(folder)))
    return path if path.is_absolute() else Path(base) / path
