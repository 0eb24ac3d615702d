"""Running one bad-input case through the real ``hpcrl`` command, in this process.

A case is argv for ``hpcrl.cli.main.main`` plus the files it needs (written by ``setup`` into
the case's folder). The run is watched for what issue 13 forbids: an exception escaping
``main`` or a traceback in the output, a command still running after its deadline, a
secret value in the output or in any file the command wrote, and a rejection that does not
name the key it rejects.

Scheduler commands are stand-ins here (see ``write_scheduler_standins``): the corpus must
never reach the shared Slurm cluster (its job ids are fake, and a ``cancel`` case must never
cancel anybody's job), and "sacct fails", "sacct is missing" and "sacct does not know the
job" must happen on demand. The stand-ins are shell scripts on PATH, like the real commands.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

#: Secret values put into the environment of every case (token-shaped and plain).
SECRET_ENV = {
    "HF_TOKEN": "hf_" + "Corpus7Token" * 3,
    "GITHUB_PAT": "ghp_" + "CorpusPat9x" * 3,
    "DB_PASSWORD": "corpus-plain-password",
    "WANDB_API_KEY": "corpus-wandb-key-0123",
    "SHORT_PASS": "Sh0rt7",  # too short to search text for: kept out by knowing what was read
}
SECRET_VALUES = tuple(SECRET_ENV.values())
DEFAULT_DEADLINE_S = 30.0
SACCT_MODES = ("empty", "fail", "garbage", "missing", "completed", "running", "failed")


class Hang(BaseException):
    """The case ran past its deadline (a BaseException: ``main`` must not swallow it)."""


@attrs.frozen(kw_only=True)
class Case:
    family: str
    name: str
    argv: tuple[str, ...]  # "{case}" is replaced by the case folder
    setup: Callable[[Path], None] | None = None
    expect: str = "any"  # "reject": must exit non-zero; "accept": must exit 0
    keys: tuple[str, ...] = ()  # a rejection names at least one of them
    says: tuple[str, ...] = ()  # text the output must hold (e.g. "skipped")
    sacct: str = "empty"  # stand-in behaviour (SACCT_MODES)
    deadline_s: float = DEFAULT_DEADLINE_S
    verify: Callable[[Path], str | None] | None = None  # after the run: a finding, or None

    @property
    def id(self) -> str:
        return f"{self.family}:{self.name}"


@attrs.frozen(kw_only=True)
class Outcome:
    code: int | None
    output: str
    escaped: str | None  # the exception that escaped main, if any
    hung: bool
    elapsed_s: float
    written: tuple[Path, ...]  # files the command created or changed
    verified: str | None = None  # what the case's own check found


SACCT_STANDIN = """
import sys
args = sys.argv[1:]
mode = MODE
if mode == "fail":
    sys.exit("sacct: error: Slurm accounting storage is disabled")
if mode == "garbage":
    sys.stdout.buffer.write(b"not|a\\x00table\\n|||\\n\\xff\\xfe\\n")
    sys.exit(0)
fields = args[args.index("-o") + 1].split(",") if "-o" in args else ["JobID", "State"]
ids = [i for flag, value in zip(args, args[1:]) if flag == "-j" for i in value.split(",")]
print("|".join(fields))
row = {"State": mode.upper(), "ExitCode": "0:0", "ElapsedRaw": "12", "Reason": "None",
       "NodeList": "n1"}
if mode != "empty":
    for job_id in ids:
        print("|".join(job_id if f == "JobID" else row.get(f, "") for f in fields))
"""


def write_scheduler_standins(folder: Path, sacct: str) -> Path:
    """``sacct``/``scancel``/``sbatch`` stand-ins (see the module docstring); the folder to
    put first on PATH. ``missing``: a PATH where none of them exists."""
    folder.mkdir(parents=True, exist_ok=True)
    if sacct == "missing":
        return folder
    scripts = {
        "sacct": f"#!{sys.executable}\n# stand-in for sacct (tests/robust/harness.py)\n"
        + SACCT_STANDIN.replace("MODE", repr(sacct)),
        "scancel": "#!/bin/sh\n# stand-in (tests/robust/harness.py)\n"
        'echo "scancel: error: Invalid job id specified" >&2; exit 1\n',
        "sbatch": "#!/bin/sh\n# stand-in (tests/robust/harness.py)\n"
        'echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1\n',
    }
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def expire(*_: object) -> None:
        raise Hang(f"still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(folder: Path) -> dict[Path, tuple[int, int]]:
    return {
        path: (path.stat().st_mtime_ns, path.stat().st_size)
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink()
    }


def run_case(case: Case, folder: Path, main: Callable[[list[str]], int]) -> Outcome:
    """Run ``case`` in ``folder`` (the working directory; environment set by the caller)."""
    if case.setup is not None:
        case.setup(folder)
    before = snapshot(folder)
    argv = [arg.replace("{case}", str(folder)) for arg in case.argv]
    stdout, stderr = io.StringIO(), io.StringIO()
    code, escaped, hung = None, None, False
    started = time.monotonic()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            with deadline(case.deadline_s):
                code = main(argv)
        except Hang:
            hung = True
        except SystemExit as exit_:  # argparse's own usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
        except BaseException as error:  # noqa: BLE001 - anything escaping main is a finding
            escaped = f"{type(error).__name__}: {error}"
    elapsed_s = time.monotonic() - started
    after = snapshot(folder)
    written = tuple(sorted(path for path, stamp in after.items() if before.get(path) != stamp))
    verified = case.verify(folder) if case.verify is not None else None
    return Outcome(
        verified=verified,
        code=code,
        output=stdout.getvalue() + stderr.getvalue(),
        escaped=escaped,
        hung=hung,
        elapsed_s=elapsed_s,
        written=written,
    )


def findings(case: Case, outcome: Outcome) -> list[str]:
    """Everything wrong with how the command handled the case (empty: handled well)."""
    found = []
    if outcome.hung:
        found.append(f"hang: no answer within {case.deadline_s:.0f} s")
    if outcome.escaped is not None:
        found.append(f"traceback: {outcome.escaped}")
    if "Traceback (most recent call last)" in outcome.output:
        found.append("traceback in the output")
    if "internal error" in outcome.output:
        found.append("internal error: " + outcome.output.strip().splitlines()[-1][:200])
    found += [f"leak: a secret in {where}" for where in leaks(outcome)]
    if outcome.verified:
        found.append(outcome.verified)
    if outcome.hung or outcome.escaped is not None:
        return found
    if case.expect == "reject" and outcome.code == 0:
        found.append("wrong accept: exit code 0")
    if case.expect == "accept" and outcome.code != 0:
        found.append(f"wrong reject: exit code {outcome.code}: {outcome.output[-300:]}")
    if outcome.code not in (0, None) and case.keys:
        flat = " ".join(outcome.output.split())
        if not any(key in flat for key in case.keys):
            found.append(f"rejection names none of {list(case.keys)}: {flat[-300:]}")
    for text in case.says:
        if text not in " ".join(outcome.output.split()):
            found.append(f"output does not say {text!r}: {outcome.output[-300:]}")
    return found


def leaks(outcome: Outcome) -> list[str]:
    where = ["the output" for value in SECRET_VALUES if value in outcome.output]
    for path in outcome.written:
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            continue
        where += [str(path) for value in SECRET_VALUES if value in text]
    return sorted(set(where))


#: Waits shortened for the corpus (a job the scheduler never knew, sacct failing).
SHORT_WAITS = {
    "poll_s": 0.05,
    "unknown_grace_s": 0.5,
    "unreachable_grace_s": 1.0,
    "sacct_lag_s": 0.2,
}


def short_waits(setattr_: Callable[..., None]) -> None:
    """Make ``--wait``/``logs -f`` give up on a lost job in a second (``setattr_`` is
    pytest's ``monkeypatch.setattr``, or plain ``setattr`` in ``measure``)."""
    try:
        from hpcrl.submit import waiting

        short = waiting.WaitSettings(**SHORT_WAITS)
    except (ImportError, TypeError):
        return
    setattr_(waiting, "default_wait_settings", lambda: short)


def case_environment(folder: Path, sacct: str) -> dict[str, str]:
    """The environment a case runs in: secrets set, scheduler stand-ins first on PATH (or no
    PATH entry with a scheduler at all), no user or site profiles, wide output."""
    standins = write_scheduler_standins(folder.parent / f"{folder.name}-bin", sacct)
    path = (
        str(standins)
        if sacct == "missing"
        else os.pathsep.join([str(standins), "/usr/bin", "/bin"])
    )
    return {
        **SECRET_ENV,
        "PATH": path,
        "HOME": str(folder / "home"),
        "XDG_CONFIG_HOME": str(folder / "no-user-config"),
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
