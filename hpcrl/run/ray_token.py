"""The job's Ray token file: one per run folder, readable by its owner only.

``<run_dir>/auth/`` (mode 0700) holds ``ray_token`` (mode 0600; the path is the plan's rule,
``hpcrl.plan.ray_auth.token_path``): 64 hex digits (32 random bytes from ``secrets``) and a
newline, the form Ray reads from ``RAY_AUTH_TOKEN_PATH`` (its first line, trimmed). The token
is written nowhere else: not into the script, the manifest, ``jobspec.json``, a log or a
printed command. Every node's Ray and the driver read it
through ``RAY_AUTH_TOKEN_PATH`` (``hpcrl.job.ray_auth``), so a process listing or environment
dump shows only the path.

It is created when the run folder is written (``hpcrl render``/``submit``/``sweep``: each sweep
point has its own), and by node 0 of a job whose run folder has none (a node entrypoint run
directly). Every later attempt of the job (requeues) reads the same file. The modes are set
explicitly rather than left to the umask: a group- or world-readable token admits anyone who
can read it.

Only the standard library: both the login side and the job side import this module.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrl.run.jobspec import JobSpec

TOKEN_BYTES = 32
AUTH_DIR_MODE = 0o700
TOKEN_FILE_MODE = 0o600
_TOKEN_TEXT = re.compile(r"[0-9a-f]{64}\n?")
_TOKEN = "the job's Ray token"


class TokenFileError(RuntimeError):
    """The token file cannot be created, or exists but is not private or not a token."""


def write_job_token(spec: JobSpec) -> None:
    """The run folder's token file for a planned job (none for a sweep's array folder: each
    point has its own); a folder that cannot hold it privately is a ``ConfigError``."""
    if spec.ray_token_path is None or spec.array_size is not None:
        return
    try:
        ensure_token_file(spec.ray_token_path)
    except (TokenFileError, OSError) as error:
        from hpcrl.config.errors import ConfigError, Problem
        from hpcrl.run.atomic_files import NoSpaceLeft, is_disk_full

        if is_disk_full(error):  # not a question of file modes
            raise NoSpaceLeft(Path(spec.ray_token_path).parent.parent, error) from None  # type: ignore[arg-type]

        raise ConfigError([Problem(
            path="run_dir", value=spec.run_dir,
            message=f"cannot keep the job's Ray token private here: {error}",
            fix="choose a run folder on a filesystem that keeps file modes (-o/--out), or fix "
                "the named file's owner/mode",
        )]) from None  # fmt: skip


def ensure_token_file(path: str | os.PathLike[str]) -> Path:
    """Create the token file at ``path`` unless it exists, check it, return its path.

    Safe against a concurrent creator: the complete file appears under its name in one step
    (``link`` of a private temp file, which fails when the name exists), so a reader never
    sees a half-written token and two creators never both win.
    """
    path = Path(path)
    make_private_dir(path.parent)
    problem = private_path_problem(path.parent, stat.S_ISDIR, _TOKEN)  # before a token goes in
    if problem is None and not os.path.lexists(path):
        _publish_new_token(path)
    problem = problem or token_file_problem(path)
    if problem is not None:
        raise TokenFileError(problem)
    return path


def token_file_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with an existing token file (None: private and well formed)."""
    path = Path(path)
    problem = private_path_problem(path.parent, stat.S_ISDIR, _TOKEN) or private_path_problem(
        path, stat.S_ISREG, _TOKEN
    )
    if problem is not None:
        return problem
    with open(path, encoding="ascii", errors="replace") as file:
        if not _TOKEN_TEXT.fullmatch(file.read(100)):
            return f"{path} does not hold a token (64 hex digits); delete it to get a new one"
    return None


def private_path_problem(
    item: Path, is_expected_type: Callable[[int], bool], exposes: str
) -> str | None:
    """Why others could reach ``item`` (this user's folder or file holding what ``exposes``
    names), if they could: not there, another type, another owner, or a mode open to others."""
    try:
        info = os.lstat(item)
    except FileNotFoundError:
        return f"{item} does not exist"
    if not is_expected_type(info.st_mode):
        return f"{item} is not a plain {'folder' if is_expected_type is stat.S_ISDIR else 'file'}"
    if info.st_uid != os.getuid():
        return f"{item} belongs to uid {info.st_uid}, not to this user ({os.getuid()})"
    if info.st_mode & 0o077:
        return (
            f"{item} has mode {stat.S_IMODE(info.st_mode):04o}: others could reach {exposes} "
            f"(hpcrl makes such folders {AUTH_DIR_MODE:04o} and files {TOKEN_FILE_MODE:04o}; a "
            "filesystem that does not keep modes cannot hold them)"
        )
    return None


def make_private_dir(folder: Path) -> None:
    """``folder`` (and its parents), made 0700 when this call creates it; an existing one is
    left for the caller to check (``private_path_problem``)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, AUTH_DIR_MODE)
    except FileExistsError:
        return  # checked by token_file_problem
    os.chmod(folder, AUTH_DIR_MODE)  # mkdir's mode is masked by the umask


def _publish_new_token(path: Path) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    _write_new_token(partial)
    try:
        os.link(partial, path)
    except FileExistsError:
        pass  # a concurrent creator won; its token is the job's
    except OSError:  # a filesystem without hard links: create the name itself exclusively
        try:
            _write_new_token(path)
        except FileExistsError:
            pass
    finally:
        os.unlink(partial)


def _write_new_token(path: Path) -> None:
    """Create ``path`` holding a new token; a write that fails (a full disk) leaves no file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, TOKEN_FILE_MODE)
    try:
        os.fchmod(fd, TOKEN_FILE_MODE)  # open's mode is masked by the umask
        os.write(fd, (secrets.token_hex(TOKEN_BYTES) + "\n").encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
