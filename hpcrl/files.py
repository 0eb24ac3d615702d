"""Writing run-folder files: the one write primitive of the login-node side, and the run-folder lock.

Every file hpcrl writes into a run folder (``job.sbatch``, ``recipe.resolved.yaml``,
``manifest.json``, ``jobspec.json``, ``job.json``, ``sweep.json``) goes through
``write_file``:

- atomically: the text goes to a temporary file beside the target, which then replaces it
  in one rename, so a reader (``hpcrl status``, a node reading ``jobspec.json``) never sees
  half a file;
- through a temporary name that is unique and opened exclusively (``O_CREAT | O_EXCL |
  O_NOFOLLOW``): two writers never share one, and a symlink planted at a temporary name is
  never followed (the open fails and another name is drawn); the rename replaces a symlink
  at the target itself, never what it points to;
- with the modes the user's umask allows: files are created 0666 (scripts 0777) minus the
  umask, like ``touch``; hpcrl never widens them with a chmod.

``run_folder_lock`` serialises the commands that write one run folder (two ``hpcrl render``
or ``submit`` of the same folder at once). It sits here, not under ``hpcrl/render``, because
the render and submit stages both write run folders and the job side may as well.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

from hpcrl.config.errors import UserError
from hpcrl.config.secrets import find_secrets
from hpcrl.plan.jobspec_file import JOBSPEC_FILE

FILE_MODE = 0o666  # before the umask: what `touch` creates
EXECUTABLE_MODE = 0o777
LOCK_NAME = ".hpcrl.lock"
#: Files that make a folder an earlier run (or sweep) folder that may be written again.
RUN_FOLDER_MARKS = frozenset({"manifest.json", "sweep.json"})
#: What a render writes; "auth" (the job's Ray token, hpcrl.plan.ray_auth.AUTH_DIR_NAME) comes
#: first, so a render stopped after it leaves a folder that the next render may still take.
RENDER_NAMES = frozenset(
    {"job.sbatch", "recipe.resolved.yaml", JOBSPEC_FILE, "code", "auth", *RUN_FOLDER_MARKS}
)
TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")  # what _open_exclusive_temp draws
LOCK_TIMEOUT_S = 30.0
LOCK_POLL_S = 0.1
_TEMP_ATTEMPTS = 16
#: Filesystems without flock (some NFS setups) answer with one of these; the folder is then
#: written unlocked rather than not at all.
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunFolderBusy(UserError):
    """Another hpcrl command holds the run folder's lock."""

    def __init__(self, folder: Path, waited_s: float, holder: str):
        super().__init__(
            f"{folder}: another hpcrl command ({holder}) is writing this run folder; "
            f"gave up after {waited_s:.0f} s",
            fix="wait for it to finish, or write to another folder with -o/--out",
        )


def write_file(path: Path, content: str | bytes, *, executable: bool = False) -> Path:
    """Replace ``path`` with ``content`` atomically; see the module docstring.

    Text is refused (``SecretInRunFile``) when it holds a secret: the value of one of this
    shell's secret-shaped variables or a well-known token shape (``hpcrl.config.secrets``).
    """
    path = Path(path)
    if isinstance(content, str):
        refuse_secrets(path, content)
    data = content.encode("utf-8") if isinstance(content, str) else content
    mode = EXECUTABLE_MODE if executable else FILE_MODE
    temp_path, fd = _open_exclusive_temp(path, mode)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_path)
        raise
    return path


class SecretInRunFile(UserError):
    """Text about to be written to a run file holds a secret."""


def refuse_secrets(path: Path, text: str) -> None:
    found = find_secrets(text)
    if found:
        raise SecretInRunFile(
            f"refusing to write {path}: it would hold {', '.join(found)}; secret values never "
            "go into run files",
            fix="remove the value from the recipe, overrides and profile, and list the variable "
            "under the cluster profile's pass_env (the job gets it from the submitting shell)",
        )


def current_umask() -> int:
    """The process umask (reading it means setting it; put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_symlink(path: Path, target: str) -> Path:
    """Point the symlink ``path`` at ``target`` atomically (a re-render may point it at a
    newer code bundle), through a unique temporary name like ``write_file``."""
    path = Path(path)
    for _ in range(_TEMP_ATTEMPTS):
        temp_path = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.symlink(target, temp_path)
        except FileExistsError:
            continue
        try:
            os.replace(temp_path, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_path)
            raise
        return path
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def _open_exclusive_temp(path: Path, mode: int) -> tuple[Path, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMP_ATTEMPTS):
        temp_path = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return temp_path, os.open(temp_path, flags, mode)
        except FileExistsError:
            continue  # taken (or a planted symlink): draw another name
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


@contextlib.contextmanager
def run_folder_lock(
    folder: Path, *, timeout_s: float = LOCK_TIMEOUT_S, command: str = "hpcrl"
) -> Iterator[Path]:
    """Create ``folder`` (with parents) and hold its lock (``<folder>/.hpcrl.lock``) inside.

    Waits up to ``timeout_s`` for another holder, then raises ``RunFolderBusy`` naming it.
    Not re-entrant: take it once per command, around everything that writes the folder.
    """
    folder = Path(folder)
    lock_path = folder / LOCK_NAME
    refuse_foreign_folder(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as error:
        raise unusable_folder(folder, error) from None
    try:
        if _acquire(fd, timeout_s, folder, lock_path):
            os.ftruncate(fd, 0)
            os.write(fd, f"{command} (pid {os.getpid()})\n".encode())
        yield folder
    finally:
        os.close(fd)  # closing releases the lock


def refuse_foreign_folder(folder: Path) -> None:
    """A run folder is new, empty, or an earlier run's (it has ``manifest.json`` or
    ``sweep.json``): never a folder holding other files (``-o /`` or ``-o ~``)."""
    try:
        entries = sorted(entry.name for entry in os.scandir(folder))
    except FileNotFoundError:
        return
    except NotADirectoryError as error:
        raise unusable_folder(folder, error) from None
    except OSError:
        return  # unreadable: creating the lock says why
    if RUN_FOLDER_MARKS & set(entries) or all(_is_ours(entry) for entry in entries):
        return  # (one being written now by another command counts as ours)
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    raise UserError(
        f"{folder}: holds files that are not a run's ({shown}); hpcrl writes only into a new or "
        "empty folder, or an earlier run folder",
        fix="choose a new folder with -o/--out",
    )


#: submitit's files of a submitted job are named after its id: ``41_submitted.pkl``,
#: ``41_0_log.out``, ``41_submission.sh``; a submission that failed leaves only uuid names.
SUBMITTED_JOB_FILE = re.compile(r"[0-9]+_.+")


def holds_submitted_job(folder: Path) -> bool:
    """A job was submitted from this run (or sweep) folder: it has its record (``job.json``,
    ``sweep.json`` with an array id is read by the sweep code) or submitit's files of a job
    id. A folder whose submission failed (sbatch refused it or did not answer) holds none:
    it may be written and submitted again."""
    if (folder / "job.json").exists():
        return True
    try:
        names = [entry.name for entry in os.scandir(folder / "submitit")]
    except OSError:
        return False
    return any(SUBMITTED_JOB_FILE.fullmatch(name) for name in names)


def _is_ours(name: str) -> bool:
    return name in RENDER_NAMES or name == LOCK_NAME or TEMP_NAME.fullmatch(name) is not None


def unusable_folder(folder: Path, error: OSError) -> UserError:
    """The one-line reason why ``folder`` cannot hold a run folder."""
    if isinstance(error, FileExistsError | NotADirectoryError):
        reason = "it (or a folder above it) is a file, not a folder"
    elif error.errno == errno.ENOENT:
        reason = "this filesystem does not let hpcrl create it"
    else:
        reason = error.strerror or str(error)
        if error.filename and Path(error.filename) != folder:
            reason += f" ({error.filename})"
    return UserError(
        f"{folder}: cannot be used as a run folder: {reason}",
        fix="choose a writable folder with -o/--out",
    )


def _acquire(fd: int, timeout_s: float, folder: Path, lock_path: Path) -> bool:
    """True when locked, False where the filesystem has no locks; RunFolderBusy on timeout."""
    from hpcrl.polling import wait_until

    def locked() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    try:
        if wait_until(locked, timeout_s, interval_s=LOCK_POLL_S):
            return True
    except OSError as error:
        if error.errno in _NO_LOCKING:
            return False
        raise
    raise RunFolderBusy(folder, timeout_s, _holder(lock_path))


def _holder(lock_path: Path) -> str:
    try:
        return lock_path.read_text(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
