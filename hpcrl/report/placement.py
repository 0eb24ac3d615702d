"""How each run ended and which sweep points shared a node, for the report's markers.

The state comes from the run folder when it says so (the driver's ``status/done`` exit code)
and from the scheduler otherwise (one query for all rows; a scheduler that does not answer
leaves ``UNKNOWN``). A folder never submitted has no state ('').

Where a point ran: the hosts in its attempt banners (``· node 0 (n1) · <start> =====``), from
its first banner's time to its ``status/done`` (or its last log write). Two points whose hosts
meet and whose times overlap shared a node: their step times and memory are not alone.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from pathlib import Path

import attrs

BANNER = re.compile(
    r"^===== hpcrl attempt \d+ · job \S+ · node \d+ \((?P<host>[^)]*)\) · (?P<time>\S+) =====$",
    re.MULTILINE,
)


@attrs.frozen
class Placement:
    hosts: frozenset[str]
    start_s: float
    end_s: float


def _done_marker(run_dir: Path) -> dict | None:
    try:
        marker = json.loads((Path(run_dir) / "status" / "done").read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def run_states(run_dirs: Sequence[Path]) -> list[str]:
    """COMPLETED / FAILED / CANCELLED / ... per run; '' for a folder never submitted."""
    states: list[str | None] = []
    for run_dir in run_dirs:
        marker = _done_marker(run_dir)
        code = marker.get("exit_code") if marker else None
        if isinstance(code, int) and not isinstance(code, bool):
            states.append("COMPLETED" if code == 0 else "FAILED")
        elif not (Path(run_dir) / "job.json").is_file():
            states.append("")
        else:
            states.append(None)  # ask the scheduler
    asked = [run_dir for run_dir, state in zip(run_dirs, states, strict=True) if state is None]
    if asked:
        answers = iter(_scheduler_states(asked))
        states = [state if state is not None else next(answers) for state in states]
    return [state or "" for state in states]


def _scheduler_states(run_dirs: Sequence[Path]) -> list[str]:
    from hpcrl.config.errors import UserError
    from hpcrl.run.job_record import JobRecord, read_job_record
    from hpcrl.submit.job_state import query_statuses

    records: list[JobRecord | None] = []
    for run_dir in run_dirs:
        try:
            records.append(read_job_record(run_dir))
        except UserError:
            records.append(None)
    known = [record for record in records if record is not None]
    statuses = iter(query_statuses(known))
    return ["UNKNOWN" if record is None else next(statuses).state for record in records]


def placement_of(run_dir: Path) -> Placement | None:
    """Hosts and time span of a run, from its submitit logs (None: it never started)."""
    hosts, starts = set(), []
    for log in sorted((Path(run_dir) / "submitit").glob("*_log.err")) + sorted(
        Path(run_dir).parent.joinpath("submitit").glob("*_log.err")
    ):
        text = log.read_text(errors="replace")
        for match in BANNER.finditer(text):
            if _belongs(log, run_dir):
                hosts.add(match["host"])
                starts.append(_timestamp(match["time"]))
    known_starts = [start for start in starts if start is not None]
    if not hosts or not known_starts:
        return None
    marker = _done_marker(run_dir)
    end = marker.get("time") if marker else None
    if not isinstance(end, int | float):
        end = max(path.stat().st_mtime for path in Path(run_dir).rglob("*") if path.is_file())
    return Placement(frozenset(hosts), min(known_starts), float(end))


def _belongs(log: Path, run_dir: Path) -> bool:
    """An array's logs sit in the sweep's submitit/ as ``<array>_<index>_<task>_log.err``."""
    if log.parent.parent == Path(run_dir):
        return True
    index = Path(run_dir).name.removeprefix("point-")
    parts = log.name.split("_")
    return len(parts) >= 4 and parts[1] == index


def _timestamp(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def shared_nodes(placements: Sequence[Placement | None]) -> list[bool]:
    """Per run: did it run on a host at the same time as another run of the list?"""
    shared = [False] * len(placements)
    for i, first in enumerate(placements):
        for j in range(i + 1, len(placements)):
            second = placements[j]
            if first is None or second is None or not first.hosts & second.hosts:
                continue
            if first.start_s < second.end_s and second.start_s < first.end_s:
                shared[i] = shared[j] = True
    return shared
