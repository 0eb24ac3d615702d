"""Writing run-folder files: the one write primitive both sides use.

Every file hpcrl writes into a run folder (``job.sbatch``, ``recipe.resolved.yaml``,
``manifest.json``, ``jobspec.json``, ``job.json``, ``sweep.json``, ``status/cause.<r>.json``,
a rewritten ``metrics.jsonl``) goes through ``write_file``:

- atomically: the text goes to a temporary file beside the target, which then replaces it
  in one rename, so a reader (``hpcrl status``, a node reading ``jobspec.json``) never sees
  half a file;
- through a temporary name that is unique and opened exclusively (``O_CREAT | O_EXCL |
  O_NOFOLLOW``): two writers never share one, and a symlink planted at a temporary name is
  never followed (the open fails and another name is drawn); the rename replaces a symlink
  at the target itself, never what it points to;
- with the modes the user's umask allows: files are created 0666 (scripts 0777) minus the
  umask, like ``touch``; hpcrl never widens them with a chmod.

The lock that serialises the commands writing one run folder is ``hpcrl.run.folder_lock``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from pathlib import Path

from hpcrl.config.errors import UserError
from hpcrl.config.secrets import find_secrets

FILE_MODE = 0o666  # before the umask: what `touch` creates
EXECUTABLE_MODE = 0o777
TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")  # what _open_exclusive_temp draws
_TEMP_ATTEMPTS = 16


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
    try:
        temp_path, fd = _open_exclusive_temp(path, mode)
    except OSError as error:
        raise no_space_or(error, path.parent) from None
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp_path, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temp_path)
        if isinstance(error, OSError):
            raise no_space_or(error, path.parent) from None
        raise
    return path


class NoSpaceLeft(UserError):
    """The filesystem of a run folder is full (or the user's quota is used up): said with the
    folder, and what the command had begun there is removed."""

    def __init__(self, folder: Path, error: OSError):
        what = "the disk quota is used up" if error.errno == errno.EDQUOT else "the disk is full"
        super().__init__(
            f"no space left on {folder} ({what}); nothing was left behind",
            fix=f"free space there (df -h {folder}), or write the run elsewhere with -o/--out",
        )


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, NoSpaceLeft) or (
        isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
    )


def no_space_or(error: OSError, folder: Path) -> OSError | NoSpaceLeft:
    """``NoSpaceLeft`` for a full disk, naming ``folder``; else ``error`` itself."""
    return NoSpaceLeft(folder, error) if is_disk_full(error) else error


def make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents, outermost first; returns those it created.
    A loop, not ``Path.mkdir(parents=True)``, whose recursion ends in a RecursionError for a
    path about a thousand folders deep."""
    missing = []
    current = Path(os.path.abspath(folder))
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    created = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        created.append(path)
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
    return created


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
