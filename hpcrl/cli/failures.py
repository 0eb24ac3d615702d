"""How the ``hpcrl`` command ends when something goes wrong: one clear line, a non-zero code.

Recipe and profile problems are listed together (exit 2). Every other mistake a user can
make (a run folder that is not one, a file that cannot be written, a scheduler command that
fails) is one line: ``hpcrl <command>: error: <what and where> (fix: <what to do>)``, exit
1. Anything else is a bug in hpcrl: one line saying so (exit 70); ``hpcrl --debug`` shows
the stack. Secret values never reach the terminal (``hpcrl.config.secrets.redact``).
"""

from __future__ import annotations

import os
import sys

EXIT_CONFIG = 2
EXIT_USER = 1
EXIT_BUG = 70  # EX_SOFTWARE
EXIT_INTERRUPTED = 130


def report_failure(command: str, error: BaseException) -> int:
    """Print what went wrong for ``error`` (raised by ``hpcrl <command>``); the exit code."""
    from hpcrl.config.errors import ConfigError, UserError

    if isinstance(error, ConfigError):
        from hpcrl.config.errors import print_problems

        print_problems(error.problems)
        return EXIT_CONFIG
    if isinstance(error, KeyboardInterrupt):
        _say(command, "interrupted")
        return EXIT_INTERRUPTED
    if isinstance(error, BrokenPipeError):  # `hpcrl ... | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if isinstance(error, UserError):
        _say(command, f"error: {error.one_line()}")
        return error.exit_code
    if isinstance(error, OSError):
        _say(command, f"error: {describe_os_error(error)}")
        return EXIT_USER
    _say(
        command,
        f"internal error: {type(error).__name__}: {error} (a bug in hpcrl: run the same "
        "command with --debug for the stack and report it)",
    )
    return EXIT_BUG


def describe_os_error(error: OSError) -> str:
    """``<file>: <reason> (fix: ...)`` for an operating-system error on a file."""
    reason = error.strerror or str(error)
    where = f"{error.filename}: " if error.filename else ""
    if error.filename2:
        where = f"{error.filename} -> {error.filename2}: "
    return f"{where}{reason} (fix: check the path, its permissions and free space)"


def _say(command: str, text: str) -> None:
    from hpcrl.config.secrets import redact

    line = " ".join(redact(f"hpcrl {command}: {text}").split())  # one line, whatever the text
    print(line, file=sys.stderr)
