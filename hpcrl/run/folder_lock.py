"""The run-folder lock, and which folders hpcrl may write a run into.

``run_folder_lock`` serialises the commands that write one run folder (two ``hpcrl render``
or ``submit`` of the same folder at once). It sits in the run-folder contract, not under
``hpcrl/render``, because the render and submit stages both write run folders and the job
side may as well. ``refuse_foreign_folder`` keeps hpcrl out of folders that hold other files;
``holds_submitted_job`` tells a folder a job was submitted from.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

from hpcrl.config.errors import UserError
from hpcrl.run.atomic_files import (
    FILE_MODE,
    TEMP_NAME,
    NoSpaceLeft,
    is_disk_full,
    make_folders,
)
from hpcrl.run.jobspec_file import JOBSPEC_FILE

LOCK_NAME = ".hpcrl.lock"
#: Files that make a folder an earlier run (or sweep) folder that may be written again.
RUN_FOLDER_MARKS = frozenset({"manifest.json", "sweep.json"})
#: What a render writes; "auth" (the job's Ray token, hpcrl.plan.ray_auth.AUTH_DIR_NAME) comes
#: first, so a render stopped after it leaves a folder that the next render may still take.
RENDER_NAMES = frozenset(
    {"job.sbatch", "recipe.resolved.yaml", JOBSPEC_FILE, "code", "auth", *RUN_FOLDER_MARKS}
)
LOCK_TIMEOUT_S = 30.0
LOCK_POLL_S = 0.1
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
    created: list[Path] = []
    try:
        created = make_folders(folder)
        lock_was_there = os.path.lexists(lock_path)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as error:
        _remove_created(created, None)
        raise (
            NoSpaceLeft(folder, error) if is_disk_full(error) else unusable_folder(folder, error)
        ) from None
    try:
        if _acquire(fd, timeout_s, folder, lock_path):
            os.ftruncate(fd, 0)
            os.write(fd, f"{command} (pid {os.getpid()})\n".encode())
        yield folder
    except BaseException as error:
        if not is_disk_full(error):
            raise
        # A full disk leaves what this command began: the folders it made, or its lock file.
        _remove_created(created, None if lock_was_there else lock_path)
        if isinstance(error, OSError):
            raise NoSpaceLeft(folder, error) from None
        raise
    finally:
        os.close(fd)  # closing releases the lock


def _remove_created(created: list[Path], lock_path: Path | None) -> None:
    """Remove the outermost folder this command created (with all it wrote inside), or only
    the lock file it created in a folder that was there before."""
    import shutil

    if created:
        shutil.rmtree(created[0], ignore_errors=True)
    elif lock_path is not None:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)


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


def next_free_folder(base: Path) -> tuple[Path, bool]:
    """``base``, else ``base-2``, ``base-3``, ... : the first that holds no submitted job (a
    folder whose submission failed is used again); and whether it was numbered."""
    number, folder = 1, base
    while holds_submitted_job(folder):
        number += 1
        folder = base.with_name(f"{base.name}-{number}")
    return folder, number > 1


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
    from hpcrl.run.polling import wait_until

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
