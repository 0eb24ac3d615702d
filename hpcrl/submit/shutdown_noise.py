"""A cancelled job's logs end with one line saying so, not with its shutdown noise.

When a job is cancelled, every process of it is signalled and says so at length: Ray's C++
signal handler dumps its stack (``*** SIGTERM received at time=...``, twice), the autoscaler
prints a traceback, srun and slurmstepd announce the cancellation, submitit logs the signals
it passes on, a local job's Python tasks die in a ``KeyboardInterrupt`` traceback. None of it
is about the training. ``hpcrl logs`` leaves out, in the attempt that was cancelled, each
file's lines from the first of these on, and ends the run's logs with
``[hpcrl] job 41 was cancelled at ... by alice (hpcrl cancel); 23 lines of shutdown output
left out (hpcrl logs --raw shows them)``. ``--raw`` shows every line.

Who and when: ``hpcrl cancel`` writes ``cancelled.json`` (job, attempt, user, time) before it
signals the job; a job cancelled with scancel is known by slurmstepd's ``*** JOB 41 ON n1
CANCELLED AT <time> ***`` line in its log.
"""

from __future__ import annotations

import datetime
import getpass
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

from hpcrl.run.atomic_files import write_file
from hpcrl.run.attempt_banner import ATTEMPT_BANNER_RE
from hpcrl.run.job_record import JobRecord, utc_now_iso

CANCEL_NOTE_NAME = "cancelled.json"
#: The first line of a process's reaction to being signalled at a cancel.
SHUTDOWN_START = re.compile(
    r"\*\*\* SIGTERM received at time="
    r"|^srun: (?:got SIGCONT|Job step aborted|forcing job termination|launch/slurm: _step_signal)"
    r"|^srun: error: \S+: tasks? [0-9,-]+: (?:Killed|Terminated)"
    r"|^slurmstepd(?:-\S+)?: error: \*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT "
    r"|^submitit WARNING \(.*\) - Bypassing signal SIG(?:TERM|CONT|INT)"
)
TRACEBACK_START = "Traceback (most recent call last):"
SLURM_CANCELLED = re.compile(
    r"^slurmstepd(?:-\S+)?: error: \*\*\* JOB (?P<job>\S+) ON \S+ CANCELLED AT (?P<at>\S+)"
    r"(?P<rest>.*)$",
    re.MULTILINE,
)


@attrs.frozen(kw_only=True)
class Cancellation:
    """The run's job was cancelled: in ``attempt`` (counted from 1, through the run), at
    ``at``, by ``by`` when known."""

    job_id: str
    attempt: int
    at: str
    by: str | None = None

    def line(self, hidden: int) -> str:
        who = f" by {self.by} (hpcrl cancel)" if self.by else ""
        shown = "" if not hidden else (
            f"; {hidden} line(s) of shutdown output left out (hpcrl logs --raw shows them)"
        )  # fmt: skip
        return f"job {self.job_id} was cancelled at {self.at}{who}{shown}"


def write_cancel_note(run_dir: Path, record: JobRecord, attempt: int) -> None:
    """Before ``hpcrl cancel`` signals the job: who cancels which attempt of it, when."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    note = {"job_id": record.job_id, "attempt": attempt, "by": user, "at": utc_now_iso()}
    write_file(Path(run_dir) / CANCEL_NOTE_NAME, json.dumps(note, indent=2) + "\n")


def cancellation_of(
    run_dir: Path, record: JobRecord, stderr_texts: Iterable[str]
) -> Cancellation | None:
    """The cancellation of the record's job: ``hpcrl cancel``'s note, else slurmstepd's line
    in the tasks' error logs (``stderr_texts``); None when the job was not cancelled."""
    try:
        note = json.loads((Path(run_dir) / CANCEL_NOTE_NAME).read_text())
    except (OSError, ValueError):
        note = None
    if isinstance(note, dict) and note.get("job_id") == record.job_id:
        attempt, at = note.get("attempt"), note.get("at")
        if isinstance(attempt, int) and isinstance(at, str):
            by = note.get("by")
            return Cancellation(job_id=record.job_id, attempt=attempt, at=_shown_time(at),
                                by=by if isinstance(by, str) else None)  # fmt: skip
    for text in stderr_texts:
        attempt = 1
        for line in text.splitlines():
            banner = ATTEMPT_BANNER_RE.match(line)
            attempt = int(banner["attempt"]) if banner else attempt
            found = SLURM_CANCELLED.match(line)
            if found and not found["rest"].strip(" *"):  # not "DUE TO TIME LIMIT" and the like
                return Cancellation(job_id=record.job_id, attempt=attempt, at=found["at"])
    return None


def _shown_time(iso: str) -> str:
    try:
        when = datetime.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    return when.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


class NoiseFilter:
    """One log file's lines without the cancelled attempt's shutdown noise, fed in pieces of
    whole lines (``hpcrl logs -f``) or at once. ``first_attempt``: the attempt of the file's
    first line (banners mark the next ones); ``hidden``: lines left out so far."""

    def __init__(
        self, cancelled: int, first_attempt: int, shown: Callable[[str], bool] | None = None
    ) -> None:
        self.cancelled = cancelled
        self.attempt = first_attempt
        self.noisy = False
        self.hidden = 0
        self.shown = shown  # lines the view would print: only those count as left out

    def feed(self, text: str) -> str:
        kept: list[str] = []
        lines = text.splitlines(keepends=True)
        for index, line in enumerate(lines):
            banner = ATTEMPT_BANNER_RE.match(line)
            if banner:
                self.attempt, self.noisy = int(banner["attempt"]), False
            if self.attempt == self.cancelled and not self.noisy:
                self.noisy = bool(SHUTDOWN_START.search(line)) or _interrupted_traceback(
                    lines, index
                )
            if self.attempt == self.cancelled and self.noisy:
                self.hidden += self.shown is None or self.shown(line)
            else:
                kept.append(line)
        return "".join(kept)


def without_shutdown_noise(text: str, first_attempt: int, cancelled: int) -> tuple[str, int]:
    """``text`` without the cancelled attempt's lines from its first shutdown line on; and
    how many lines were left out."""
    noise = NoiseFilter(cancelled, first_attempt)
    return noise.feed(text), noise.hidden


def _interrupted_traceback(lines: list[str], index: int) -> bool:
    """A Python traceback starting at ``index`` that ends in ``KeyboardInterrupt``: a local
    job's task interrupted by the cancel."""
    if lines[index].rstrip("\n") != TRACEBACK_START:
        return False
    for line in lines[index + 1 :]:
        if line.strip() and not line.startswith((" ", "\t")):
            return line.strip() == "KeyboardInterrupt"
    return False
