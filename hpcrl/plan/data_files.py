"""The recipe's data files must exist before the job waits in a queue, and hold enough rows
for the steps asked.

``data.train_path`` and ``data.val_path`` are absolute after loading (a relative path in a
recipe resolves against the recipe's folder, so a shipped recipe finds its shipped data; an
override resolves against the working directory). They are checked on this machine: a
cluster's shared filesystems look the same from the login node. In a container a path
under a mount's container side is checked at its host side; a path under no mount can only
come from the image, which only the job sees.

A training file with fewer rows than ``max_num_steps`` steps take in ``max_num_epochs``
passes is a warning, with the numbers and the fix: the run would stop early (as NeMo RL's
does; ``hpcrl.config.data_steps``). Only as many lines are read as that takes. The first rows
must be JSON objects holding the keys the job reads from every row (``/etc/shadow`` is not a
data file, however many lines it has); a message names the line, never what it holds.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import BinaryIO

from hpcrl.config.data_steps import (
    epochs_needed,
    num_steps_in_epochs,
    required_keys,
    rows_needed,
    rows_per_step,
)
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from hpcrl.plan.findings import Findings
from hpcrl.plan.mounts import Mount, is_under

DATA_KEYS = ("train_path", "val_path")
#: Counting stops here (a file this large holds enough rows for any sensible run).
MAX_COUNTED_BYTES = 1 << 30
#: The rows whose form is checked (JSON objects holding the keys the job reads): enough to
#: tell a data file from another kind of file, without reading a large one.
FORM_CHECKED_ROWS = 100
MAX_FORM_CHECKED_BYTES = 16 << 20


def check_data_files(
    recipe: Recipe, profile: ClusterProfile, mounts: list[Mount], findings: Findings
) -> None:
    found = []
    for key in DATA_KEYS:
        path = getattr(recipe.data, key)
        if path is None:
            continue
        host_path = path if profile.container is None else _host_side(path, mounts)
        if host_path is None:
            continue  # under no mount: only the image can hold it, which only the job sees
        if not Path(host_path).is_file():
            findings.error(f"data.{key}", _why_unusable(Path(host_path), path), value=path,
                           fix=f"point data.{key} at a JSONL file (relative paths in a recipe "
                           "are relative to the recipe's folder; in an override, to the "
                           "current folder)")  # fmt: skip
            continue
        form = jsonl_form_problem(Path(host_path), required_keys(recipe))
        if form is not None:
            findings.error(f"data.{key}", form, value=path, fix=_form_fix(recipe, key))
            continue
        found.append(f"data.{key}")
        if key == "train_path":
            check_data_lasts(recipe, Path(host_path), findings)
    if found:
        findings.passed(
            "data_files",
            f"{' and '.join(found)} found, JSONL rows with {', '.join(required_keys(recipe))} "
            f"(the first {FORM_CHECKED_ROWS} rows checked)",
        )


def jsonl_form_problem(path: Path, keys: list[str]) -> str | None:
    """Why ``path`` is not a JSONL file whose rows have ``keys`` (None: its first
    ``FORM_CHECKED_ROWS`` rows are). Says where and what, never what the file holds."""
    try:
        with path.open("rb") as stream:
            lines = _first_rows(stream)
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"
    if not lines:
        return "holds no rows (a JSONL file: one JSON object per line)"
    for number, raw in lines:
        where = f"line {number} of {path.name}"
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return f"{where} is not UTF-8 text: a data file is JSONL, one JSON object per line"
        except (ValueError, RecursionError):
            return f"{where} is not JSON: a data file is JSONL, one JSON object per line"
        if not isinstance(row, dict):
            return f"{where} is a JSON {type(row).__name__}, not an object (one per line)"
        missing = [name for name in keys if name not in row]
        if missing:
            named = ", ".join(f'"{name}"' for name in missing)
            return f"{where} has no {named}: the job reads {', '.join(keys)} from every row"
    return None


def _first_rows(stream: BinaryIO) -> list[tuple[int, bytes]]:
    """(line number, bytes) of the first non-empty lines, within a bounded read."""
    rows: list[tuple[int, bytes]] = []
    for number, line in enumerate(stream, start=1):
        if line.strip():
            rows.append((number, line.strip()))
        if len(rows) >= FORM_CHECKED_ROWS or stream.tell() > MAX_FORM_CHECKED_BYTES:
            break
    return rows


def _form_fix(recipe: Recipe, key: str) -> str:
    second = "answer" if recipe.grpo is not None else "response"
    names = f"data.prompt_key and data.{second}_key"
    return (
        f"point data.{key} at a JSONL file of the recipe's rows, or set {names} to the names "
        "its rows use"
    )


def check_data_lasts(recipe: Recipe, path: Path, findings: Findings) -> None:
    """Warn when the training file gives fewer steps than ``max_num_steps``."""
    section = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert section is not None  # the config rules require one algorithm section
    name, per_step = recipe.algorithm, rows_per_step(recipe)
    wanted = rows_needed(section.max_num_steps, per_step, section.max_num_epochs)
    rows = count_rows(path, stop_at=wanted)
    if rows is None or rows >= wanted:
        return
    steps = num_steps_in_epochs(rows, per_step, section.max_num_epochs)
    per_step_key = "grpo.num_prompts_per_step" if recipe.grpo else "policy.train_global_batch_size"
    findings.warn(
        "data_steps", f"{name}.max_num_steps",
        f"asks for {section.max_num_steps} steps, but the data gives {steps}: {path.name} holds "
        f"{rows} rows, at {per_step} per step ({per_step_key}) over {section.max_num_epochs} "
        f"epoch(s) ({name}.max_num_epochs) that is {steps} step{'' if steps == 1 else 's'}; "
        f"the run stops after step {steps}",
        value=section.max_num_steps,
        fix=f"set {name}.max_num_epochs="
        f"{epochs_needed(section.max_num_steps, per_step, rows)} to pass over the data that "
        f"often (the run stops when either limit is reached, as in NeMo RL), or "
        f"{name}.max_num_steps={steps}, or give more data",
    )  # fmt: skip


def count_rows(path: Path, stop_at: int) -> int | None:
    """Non-empty lines of ``path`` (what the job's JSONL reader takes), counting no further
    than ``stop_at``; None when it cannot be read or is too large to count."""
    rows = 0
    try:
        with path.open("rb") as stream:
            for line in stream:
                rows += bool(line.strip())
                if rows >= stop_at:
                    return rows
                if stream.tell() > MAX_COUNTED_BYTES:
                    return None
    except OSError:
        return None
    return rows


def _host_side(path: str, mounts: list[Mount]) -> str | None:
    """Where a container path lies on the host, through the innermost mount covering it."""
    covering = [mount for mount in mounts if is_under(path, mount.container_path)]
    if not covering:
        return None
    mount = max(covering, key=lambda m: len(posixpath.normpath(m.container_path)))
    relative = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(mount.container_path))
    return posixpath.normpath(posixpath.join(mount.host_path, relative))


def _why_unusable(host_path: Path, path: str) -> str:
    if "://" in path:
        return "a URL: a data file is read from the job's filesystem (download it first)"
    seen_as = "" if str(host_path) == path else f" (on this machine: {host_path})"
    if host_path.is_dir():
        return f"a folder, not a data file{seen_as}"
    if host_path.exists():
        return f"not a regular file{seen_as}"
    return f"no such file{seen_as}"
