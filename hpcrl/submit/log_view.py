"""``hpcrl logs``: what a run's (or a sweep's) log files say, once each, one line style.

Every line is printed with one prefix, the same with ``-f`` and without:
``[node0 stderr] ...``, ``[node0 attempt1 driver.log] ...``, and for a sweep
``[point-1 node0 stderr] ...``. What each node's files hold twice is shown once:

- the attempt banner goes to the task's stdout and stderr (both must be split into
  attempts); it is shown from stderr only;
- submitit's logger writes every record to stdout and, from WARNING up, to stderr too
  (``submitit ERROR (...) - Submitted job triggered an exception``); those are shown from
  stderr only;
- the node entrypoint logs every line to ``node.log`` and to the task's stderr; when the
  task's stderr is shown, ``node.log`` is not (it stays on disk for grep).

Secrets are hidden in every line shown (``hpcrl.config.secrets.redact``: the values of this
shell's secret-named variables, well-known token shapes), as in error messages and causes: a
job may print what its environment holds. Escape sequences (Ray's colours) are removed unless
stdout is a terminal. Ray's state dumps
(printed by every process that saw a raylet die) are folded into one line saying where they
are. The view ends with each attempt's cause when one ended early (``hpcrl.run.causes``):
``[hpcrl] attempt 1: node 1 (n2) lost after step 3: ...``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

import attrs

from hpcrl.config.errors import UsageError, UserError
from hpcrl.config.field_bounds import MAX_REQUEUES
from hpcrl.config.secrets import redact
from hpcrl.run.attempt_banner import ATTEMPT_BANNER_RE
from hpcrl.run.causes import read_causes
from hpcrl.run.job_record import JobRecord, RunFolderError, read_job_record
from hpcrl.run.sweep_record import is_sweep_dir, read_sweep_record
from hpcrl.submit.hints import command
from hpcrl.submit.logs import LogFile, fold_state_dumps, follow, list_log_files, split_attempts
from hpcrl.submit.shutdown_noise import Cancellation, NoiseFilter, cancellation_of

#: CSI sequences (colours, cursor moves) and OSC sequences (titles, links).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
SUBMITIT_LABELS = ("stdout", "stderr")
#: The first run and Slurm's requeues, whose count is a 16-bit number (config.field_bounds).
MAX_ATTEMPTS = MAX_REQUEUES + 1
ATTEMPT_DIR = re.compile(r"attempt(?P<index>[0-9]+)/(?P<name>.+)")
#: submitit's records that its logger also writes to stderr (its handler there: WARNING up).
SUBMITIT_ON_BOTH = re.compile(r"submitit (?:WARNING|ERROR|CRITICAL) \(")


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


@attrs.frozen(kw_only=True)
class LogSelection:
    """What to show: one node (None: all), one attempt (None: all), only the driver's log;
    ``raw``: a cancelled job's shutdown noise too (``hpcrl.submit.shutdown_noise``)."""

    node: int | None = None
    attempt: int | None = None
    driver_only: bool = False
    raw: bool = False


@attrs.frozen(kw_only=True)
class LoggedRun:
    """One run whose logs are shown; ``point``: its sweep point folder name, or ''."""

    run_dir: Path
    record: JobRecord
    point: str = ""


def runs_to_show(path: Path, point: int | None) -> list[LoggedRun]:
    """The run folder itself, or a sweep's points (all, or ``--point N``) that were submitted."""
    if not is_sweep_dir(path):
        if point is not None:
            raise UserError(f"--point {point}: {path} is not a sweep folder",
                            fix="leave --point out for a single run")  # fmt: skip
        return [LoggedRun(run_dir=path, record=read_job_record(path))]
    points = read_sweep_record(path).points
    if point is not None:
        chosen = [p for p in points if p.index == point]
        if not chosen:
            raise UserError(
                f"--point {point}: the sweep {path.name} has points 0..{len(points) - 1}",
                fix="give one of those, or leave --point out for every point",
            )
        points = tuple(chosen)
    runs = []
    for entry in points:
        run_dir = path / entry.run_dir_name
        try:
            runs.append(LoggedRun(run_dir=run_dir, record=read_job_record(run_dir),
                                  point=entry.run_dir_name))  # fmt: skip
        except RunFolderError:
            if point is not None:
                raise
    if not runs:
        raise RunFolderError(f"{path}: no point of the sweep was submitted",
                             fix="submit it with hpcrl sweep (without --no-submit)")  # fmt: skip
    return runs


def label_of(log: LogFile) -> str:
    """``stdout``/``stderr``, or ``attempt<K> <file>`` with K counted from 1 like --attempt."""
    match = ATTEMPT_DIR.fullmatch(log.label)
    if match is None:
        return log.label
    return f"attempt{int(match['index']) + 1} {match['name']}"


def attempts_logged(files: Sequence[LogFile]) -> int:
    """How many attempts the files show (banners in submitit's files, attempt<r>/ folders)."""
    highest = 0
    for log in files:
        if log.label in SUBMITIT_LABELS:
            text = log.path.read_text(errors="replace")
            highest = max([highest, *split_attempts(text)]) if text else highest
        elif (match := ATTEMPT_DIR.fullmatch(log.label)) is not None:
            highest = max(highest, int(match["index"]) + 1)
    return highest


def shown_files(
    run: LoggedRun, selection: LogSelection, earlier_jobs: bool = True
) -> list[LogFile]:
    """The files of ``run`` that the view prints, in order (see the module docstring); with
    ``earlier_jobs``, a resumed run's earlier jobs' submitit files too (their attempts are the
    run's)."""
    files = list_log_files(run.run_dir, run.record, selection.node, earlier_jobs=earlier_jobs)
    if selection.driver_only:
        files = [log for log in files if log.node == 0 and log.label.endswith("/driver.log")]
    # stderr exists from the task's start, before node.log: the choice never flips while following
    with_stderr = {log.node for log in files if log.label == "stderr"}
    kept = []
    for log in files:
        match = ATTEMPT_DIR.fullmatch(log.label)
        if match is not None and match["name"] == "node.log" and log.node in with_stderr:
            continue
        if match is not None and selection.attempt is not None:
            if int(match["index"]) + 1 != selection.attempt:
                continue
        kept.append(log)
    return kept


def check_attempt(runs: Sequence[LoggedRun], selection: LogSelection) -> None:
    """``--attempt K`` beyond what every run's logs show is an error naming the ones there."""
    if selection.attempt is None:
        return
    if not 1 <= selection.attempt <= MAX_ATTEMPTS:
        raise UsageError(
            f"--attempt {selection.attempt}: attempts count from 1 to at most {MAX_ATTEMPTS:,} "
            "(a job's first run and each of its requeues; Slurm counts requeues in 16 bits)",
            fix="e.g. --attempt 1, or leave --attempt out for all",
        )
    for run in runs:
        files = list_log_files(run.run_dir, run.record, selection.node, earlier_jobs=True)
        logged = attempts_logged(files)
        if logged and selection.attempt > logged:
            where = (
                f"{run.point} (job {run.record.job_id})"
                if run.point
                else f"job {run.record.job_id}"
            )
            raise UsageError(
                f"--attempt {selection.attempt}: {where} has "
                + (f"attempts 1..{logged}" if logged > 1 else "one attempt so far"),
                fix=f"give --attempt 1..{logged}, or leave --attempt out for all",
            )


def prefixed_lines(run: LoggedRun, log: LogFile, text: str, keep_banner: bool) -> Iterator[str]:
    """The lines of ``text`` with the view's prefix and secrets hidden (every log line shown,
    by ``logs``, ``logs -f`` and ``--wait``'s tails, passes here); what stdout shares with
    stderr (attempt banners, submitit's warnings and errors) left out."""
    prefix = f"[{run.point + ' ' if run.point else ''}node{log.node} {label_of(log)}] "
    for line in redact(text).splitlines(keepends=True):
        if log.label == "stdout" and (
            (not keep_banner and ATTEMPT_BANNER_RE.match(line)) or SUBMITIT_ON_BOTH.match(line)
        ):
            continue
        yield prefix + (line if line.endswith("\n") else line + "\n")


def _cleaner(stream: TextIO) -> Callable[[str], str]:
    return (lambda text: text) if stream.isatty() else strip_ansi


def print_logs(runs: Sequence[LoggedRun], selection: LogSelection, stream: TextIO) -> bool:
    """Print what the files hold now; False when none of them holds anything yet."""
    clean = _cleaner(stream)
    printed = False
    endings = []
    for run in runs:
        cancel = None if selection.raw else _cancellation(run)
        hidden = 0
        for log in shown_files(run, selection):
            text = log.path.read_text(errors="replace")
            if log.label in SUBMITIT_LABELS and selection.attempt is not None:
                text = split_attempts(text).get(selection.attempt, "")
            first = _first_attempt(log, text, selection)
            text = fold_state_dumps(clean(text), log.path)
            if cancel is not None:
                noise = NoiseFilter(cancel.attempt, first, _shown_predicate(log))
                text = noise.feed(text)
                hidden += noise.hidden
            for line in prefixed_lines(run, log, text, keep_banner=False):
                stream.write(line)
                printed = True
        if cancel is not None and selection.attempt in (None, cancel.attempt):
            endings.append((run, cancel.line(hidden)))
    write_causes(runs, selection, stream)
    for run, line in endings:
        stream.write(f"[{run.point + ' ' if run.point else ''}hpcrl] {line}\n")
    return printed


def _cancellation(run: LoggedRun) -> Cancellation | None:
    stderr = [log.path for log in list_log_files(run.run_dir, run.record) if log.label == "stderr"]
    return cancellation_of(run.run_dir, run.record, (path.read_text(errors="replace")
                                                     for path in stderr))  # fmt: skip


def _shown_predicate(log: LogFile) -> Callable[[str], bool] | None:
    """Which of the file's lines the view prints (stdout's copies of submitit's warnings are
    shown from stderr): the shutdown lines left out are counted among those only."""
    if log.label != "stdout":
        return None
    return lambda line: SUBMITIT_ON_BOTH.match(line) is None


def _first_attempt(log: LogFile, text: str, selection: LogSelection) -> int:
    """The attempt (from 1) of the first line of ``text``, read from ``log``."""
    match = ATTEMPT_DIR.fullmatch(log.label)
    if match is not None:
        return int(match["index"]) + 1
    if selection.attempt is not None:
        return selection.attempt
    return min(split_attempts(text), default=1)


def attempt_cause_lines(run_dir: Path, attempt: int | None = None) -> list[str]:
    """``attempt 1: <cause>`` for every attempt that ended early (only ``attempt``, counted
    from 1, when given)."""
    return [
        cause.titled_line()
        for cause in read_causes(run_dir)
        if attempt is None or cause.attempt == attempt - 1
    ]


def write_causes(runs: Sequence[LoggedRun], selection: LogSelection, stream: TextIO) -> None:
    for run in runs:
        for line in attempt_cause_lines(run.run_dir, selection.attempt):
            stream.write(f"[{run.point + ' ' if run.point else ''}hpcrl] {line}\n")


def follow_logs(
    runs: Sequence[LoggedRun], selection: LogSelection, is_over: Callable[[], bool],
    poll_s: float, stream: TextIO,
) -> None:  # fmt: skip
    """Print every file as it grows until ``is_over()``. With ``--attempt`` a submitit file is
    shown from that attempt's banner on, and no more after the next attempt's banner."""
    clean = _cleaner(stream)
    owners: dict[Path, LoggedRun] = {}

    def files() -> list[LogFile]:
        found = []
        for run in runs:
            for log in shown_files(run, selection):
                owners[log.path] = run
                found.append(log)
        return found

    attempt_now: dict[Path, int] = {}
    quiet = _FollowedNoise(selection)
    for log, text in follow(files, is_over, poll_s):
        lines = text.splitlines(keepends=True)
        if log.label in SUBMITIT_LABELS and selection.attempt is not None:
            lines = _lines_of_attempt(lines, log.path, attempt_now, selection.attempt)
        text = fold_state_dumps(clean("".join(lines)), log.path)
        text = quiet.feed(owners[log.path], log, text)
        for line in prefixed_lines(owners[log.path], log, text, False):
            stream.write(line)
        stream.flush()
    write_causes(runs, selection, stream)
    for run in runs:
        ending = quiet.ending(run)
        if ending is not None:
            stream.write(f"[{run.point + ' ' if run.point else ''}hpcrl] {ending}\n")


class _FollowedNoise:
    """``hpcrl logs -f``: once ``hpcrl cancel`` has noted a run's cancellation, each file's
    shutdown noise of the cancelled attempt is left out as it arrives."""

    def __init__(self, selection: LogSelection) -> None:
        self.selection = selection
        self.attempts: dict[Path, int] = {}  # the attempt each file has reached
        self.filters: dict[Path, tuple[LoggedRun, NoiseFilter]] = {}
        self.cancels: dict[Path, Cancellation] = {}

    def feed(self, run: LoggedRun, log: LogFile, text: str) -> str:
        start = self.attempts.get(log.path) or _first_attempt(log, text, self.selection)
        banners = [int(m["attempt"]) for m in map(ATTEMPT_BANNER_RE.match, text.splitlines()) if m]
        self.attempts[log.path] = banners[-1] if banners else start
        cancel = None if self.selection.raw else self._cancellation(run)
        if cancel is None:
            return text
        noise = NoiseFilter(cancel.attempt, start, _shown_predicate(log))
        _, noise = self.filters.setdefault(log.path, (run, noise))
        return noise.feed(text)

    def _cancellation(self, run: LoggedRun) -> Cancellation | None:
        if run.run_dir not in self.cancels:
            found = cancellation_of(run.run_dir, run.record, ())  # hpcrl cancel's note
            if found is None:
                return None
            self.cancels[run.run_dir] = found
        return self.cancels[run.run_dir]

    def ending(self, run: LoggedRun) -> str | None:
        cancel = self.cancels.get(run.run_dir)
        if cancel is None or self.selection.attempt not in (None, cancel.attempt):
            return None
        hidden = sum(noise.hidden for owner, noise in self.filters.values() if owner is run)
        return cancel.line(hidden)


def _lines_of_attempt(
    lines: list[str], path: Path, attempt_now: dict[Path, int], wanted: int
) -> list[str]:
    kept = []
    for line in lines:
        match = ATTEMPT_BANNER_RE.match(line)
        if match is not None:
            attempt_now[path] = int(match["attempt"])
        if attempt_now.get(path, 1) == wanted:
            kept.append(line)
    return kept


def no_output_line(runs: Sequence[LoggedRun], selection: LogSelection, folder: Path) -> str:
    what = "the driver of " if selection.driver_only else ""
    where = f"attempt {selection.attempt} of " if selection.attempt else ""
    jobs = ", ".join(run.record.job_id for run in runs)
    return (
        f"hpcrl logs: no output yet from {what}{where}job {jobs} (queued, or just started: "
        f"{command('logs', '-f', folder)} waits for it)"
    )


def default_stream() -> TextIO:
    return sys.stdout
