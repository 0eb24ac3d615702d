"""``hpcrl report RUN_A RUN_B ...``: runs from anywhere (separate submits, reruns, points of
several sweeps) in one table and one set of overlaid curves.

Each folder given adds its rows: a run one row, a sweep one per point (``<sweep>/point-1``).
The table's value columns are the resolved-recipe keys whose values differ between the rows
(``grpo.seed``, ``policy.optimizer.kwargs.lr``; at most ``MAX_KEYS`` of them, the rest named
in a note that points at ``hpcrl diff``), so a comparison says what was compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcrl.report.summary import Report, ReportRow, report_rows, with_states

MAX_KEYS = 4
ABSENT = "(absent)"


def build_comparison(paths: Sequence[Path]) -> Report:
    """One report over every run (every sweep point) of ``paths``, in the order given."""
    rows: list[ReportRow] = []
    for path in paths:
        found, is_sweep = report_rows(Path(path))
        rows += [attrs.evolve(row, name=f"{path.name}/{row.name}") if is_sweep else row
                 for row in found]  # fmt: skip
    rows = _unique_names(rows)
    keys, values = differing_keys([row.run_dir for row in rows])
    rows = [attrs.evolve(row, swept_values=value, label=row.name)
            for row, value in zip(rows, values, strict=True)]  # fmt: skip
    notes: tuple[str, ...] = ()
    if len(keys) > MAX_KEYS:
        notes = (f"{len(keys) - MAX_KEYS} more recipe key(s) differ: "
                 f"{', '.join(keys[MAX_KEYS:])} (hpcrl diff RUN_A RUN_B lists them)",)  # fmt: skip
        keys = keys[:MAX_KEYS]
    return Report(
        title=f"{len(rows)} runs", source_dir=Path(paths[0]), swept_keys=tuple(keys),
        rows=with_states(tuple(rows)), notes=notes,
    )  # fmt: skip


def _unique_names(rows: list[ReportRow]) -> list[ReportRow]:
    """Two runs of one name in different folders are told apart by their parent's name."""
    names = [row.name for row in rows]
    return [
        attrs.evolve(row, name=f"{row.run_dir.parent.name}/{row.name}")
        if names.count(row.name) > 1 else row
        for row in rows
    ]  # fmt: skip


def differing_keys(run_dirs: Sequence[Path]) -> tuple[list[str], list[dict[str, str]]]:
    """The resolved-recipe keys whose values are not the same in every run, and each run's
    value of them as text (``(absent)`` where a run's recipe lacks the key)."""
    from hpcrl.submit.run_diff import flatten

    flats = [flatten(_resolved(run_dir)) for run_dir in run_dirs]
    keys = sorted({key for flat in flats for key in flat})
    differing = [key for key in keys if len({_text(flat.get(key, ABSENT)) for flat in flats}) > 1]
    return differing, [{key: _text(flat.get(key, ABSENT)) for key in differing} for flat in flats]


def _resolved(run_dir: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value) if value is not None else "null"


def default_out_dir(paths: Sequence[Path]) -> Path:
    """Where a comparison's plots go without ``--out``: ``./hpcrl-compare-<hash of the
    folders>``, the same folder for the same runs."""
    key = "\n".join(str(Path(path).absolute()) for path in paths)
    return Path.cwd() / f"hpcrl-compare-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
