"""Finding, slicing and following a run's logs.

Two kinds per node (one task per node, task id = node index): submitit's per-task files in
``<submitit folder>/<job>_<task>_log.{out,err}`` (everything the task printed, all attempts
appended and separated by ``NodeTask``'s attempt banners), and the node entrypoint's files
under ``<run_dir>/logs/node<k>/`` (Ray, driver).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs

from hpcrl.run.attempt_banner import ATTEMPT_BANNER_RE
from hpcrl.run.job_record import JobRecord
from hpcrl.submit.job_state import task_paths


@attrs.frozen
class LogFile:
    node: int
    label: str  # "stdout", "stderr", or the path under logs/node<k>/
    path: Path


def list_log_files(
    run_dir: Path, record: JobRecord, node: int | None = None, earlier_jobs: bool = False
) -> list[LogFile]:
    """Every log file of the run that exists now, node by node (submitit's first; with
    ``earlier_jobs``, those of the run's jobs before a ``hpcrl resume`` too, oldest first)."""
    nodes = range(record.num_tasks) if node is None else [node]
    job_ids = (*record.earlier_job_ids, record.job_id) if earlier_jobs else (record.job_id,)
    files = []
    for index in nodes:
        for job_id in job_ids:
            paths = task_paths(attrs.evolve(record, job_id=job_id), index)
            files += [
                LogFile(index, "stdout", paths.stdout), LogFile(index, "stderr", paths.stderr)
            ]  # fmt: skip
        node_dir = Path(run_dir) / "logs" / f"node{index}"
        if node_dir.is_dir():
            # attempt<r>/{node.log,ray.out,ray.err,driver.log}; Ray's own session logs, kept
            # deeper for failed attempts, are too long to print and stay on disk for reading.
            files += [
                LogFile(index, str(path.relative_to(node_dir)), path)
                for path in sorted(node_dir.glob("*/*"))
                if path.is_file()
            ]
    return [log for log in files if log.path.is_file()]


def split_attempts(text: str) -> dict[int, str]:
    """Log text by attempt number (1-based), cut at the attempt banners. Text before the
    first banner (submitit's own start lines) belongs to the first banner's attempt (a
    resumed run's job starts at a later one); without any banner (a job that died before
    Python started) it counts as attempt 1."""
    attempts: dict[int, list[str]] = {}
    first = next((ATTEMPT_BANNER_RE.match(line) for line in text.splitlines()
                  if ATTEMPT_BANNER_RE.match(line)), None)  # fmt: skip
    current = int(first.group("attempt")) if first else 1
    for line in text.splitlines(keepends=True):
        match = ATTEMPT_BANNER_RE.match(line)
        if match:
            current = int(match.group("attempt"))
        attempts.setdefault(current, []).append(line)
    return {attempt: "".join(lines) for attempt, lines in attempts.items()}


def read_log(path: Path, attempt: int | None = None) -> str:
    text = path.read_text(errors="replace")
    return text if attempt is None else split_attempts(text).get(attempt, "")


#: Ray's raylet, when it dies, has its last log lines printed by every process that saw it
#: go: its periodic state dump, a few hundred lines of event-loop counters per copy.
#: A line of it, once colours are taken out: ``    [state-dump] ...``, or with the
#: ``(raylet)`` prefix Ray gives lines it forwards to the driver.
_STATE_DUMP = re.compile(r"^\s*(?:\([^)]*\)\s*)?\[state-dump\]")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def fold_state_dumps(text: str, path: Path) -> str:
    """``text`` with each run of Ray state-dump lines replaced by one line saying how many
    were left out and where they are."""
    out: list[str] = []
    folded = 0
    for line in text.splitlines(keepends=True):
        if _STATE_DUMP.match(_COLOUR.sub("", line)):
            folded += 1
            continue
        if folded:
            out.append(_folded_note(folded, path))
            folded = 0
        out.append(line)
    if folded:
        out.append(_folded_note(folded, path))
    return "".join(out)


def _folded_note(count: int, path: Path) -> str:
    return f"    [hpcrl: {count} lines of Ray's state dump left out; they are in {path}]\n"


def tail_lines(text: str, num_lines: int) -> str:
    return "".join(text.splitlines(keepends=True)[-num_lines:])


def follow(
    list_files: Callable[[], Sequence[LogFile]],
    is_over: Callable[[], bool],
    poll_s: float = 1.0,
) -> Iterator[tuple[LogFile, str]]:
    """Yield (file, new text) as files grow, until ``is_over()`` and nothing new remains.

    Starts at each file's beginning; files that appear later (a worker node's log, the next
    attempt) are picked up on the next poll. Only whole lines are yielded while the job runs
    (a line still being written waits for its end, up to ``FOLLOW_LINE_LIMIT`` bytes), so a
    secret or a UTF-8 character is never cut in two where the view looks for it.
    """
    offsets: dict[Path, int] = {}
    while True:
        over = is_over()  # checked before reading, so output written just before the end is kept
        for log in list_files():
            start = offsets.get(log.path, 0)
            with log.path.open("rb") as stream:
                stream.seek(start)
                chunk = _whole_lines(stream.read(), over)
            if chunk:
                offsets[log.path] = start + len(chunk)
                yield log, chunk.decode(errors="replace")
        if over:
            return
        time.sleep(poll_s)


#: A line longer than this is shown in parts while it is written.
FOLLOW_LINE_LIMIT = 1 << 20


def _whole_lines(chunk: bytes, over: bool) -> bytes:
    if over or len(chunk) >= FOLLOW_LINE_LIMIT:
        return chunk
    return chunk[: chunk.rfind(b"\n") + 1]
