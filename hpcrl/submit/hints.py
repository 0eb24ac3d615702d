"""Commands hpcrl prints for the user to run next (follow, status, cancel, report, ...).

Each is one shell command line that runs as printed: every word shell-quoted (a run folder
named ``runs/sw $(touch PWNED)`` is printed ``'runs/sw $(touch PWNED)'``, never as a command
substitution), and the program named as the user invoked it (``.venv/bin/hpcrl`` when that is
what they typed and ``hpcrl`` on their PATH is another or none).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

PROGRAM = "hpcrl"


def invoked_as(argv0: str | None = None) -> str:
    """``hpcrl`` when the shell finds this very program under that name, else the path the
    user typed (``.venv/bin/hpcrl``); ``hpcrl`` when run as ``python -m ...`` (no script)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) != PROGRAM:
        return PROGRAM
    found = shutil.which(PROGRAM)
    try:
        same = found is not None and os.path.samefile(found, argv0)
    except OSError:
        same = False
    return PROGRAM if same else argv0


def shown_path(path: Path | str) -> str:
    """A path as the user should type it: relative to the working directory when inside it."""
    try:
        return str(Path(path).absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def command(*words: str | Path) -> str:
    """``hpcrl <words>`` as one shell-quoted line (paths shown relative when inside the
    working directory)."""
    texts = [shown_path(word) if isinstance(word, Path) else word for word in words]
    return shlex.join([invoked_as(), *texts])


def quoted_path(path: Path | str) -> str:
    """A path printed for copying into a command: shown as ``shown_path``, shell-quoted."""
    return shlex.quote(shown_path(path))
