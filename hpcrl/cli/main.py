"""The ``hpcrl`` command: an argparse dispatcher over the command modules.

Each module in ``COMMAND_MODULES`` exposes ``register(subparsers)`` and sets ``func`` on every
subcommand it adds (the commands listed beside it). Modules import their stages inside
``func``, so ``hpcrl --help`` loads nothing but argparse and the command modules themselves;
a line naming a known command builds only its module's commands (the other modules and
their parsers cost ~5 ms of every command: docs/performance.md, item 6).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

#: Each command module and the commands it registers (tests/cli/test_scripting.py checks them).
COMMAND_MODULES = (
    ("hpcrl.cli.prepare", ("validate", "render", "show")),
    ("hpcrl.cli.jobs", ("submit", "sweep", "status", "logs", "cancel")),
    ("hpcrl.cli.again", ("resume", "rerun")),
    ("hpcrl.cli.export", ("export",)),
    ("hpcrl.cli.report", ("report",)),
    ("hpcrl.cli.scripting", ("diff", "completion")),
)
DEBUG_FLAG = "--debug"
#: Commands that load one recipe or run, answer and exit: ``run`` leaves Python's cyclic
#: garbage collector off for their whole (short) process. Every other command (those that
#: wait on jobs, draw reports, export) gets it back before it starts its work.
SHORT_COMMANDS = frozenset({"validate", "render", "show", "diff", "completion"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; given a known ``command``, the parser of its module's commands only
    (it parses that command's lines exactly as the whole one does)."""
    from hpcrl import __version__

    parser = argparse.ArgumentParser(
        prog="hpcrl",
        description="Recipe + cluster profile -> checked plan -> sbatch script -> Slurm job.",
    )
    parser.add_argument("--version", action="version", version=f"hpcrl {__version__}")
    parser.add_argument(
        DEBUG_FLAG,
        action="store_true",
        help="on an error, show Python's stack (also HPCRL_DEBUG=1)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    owners = [module for module, commands in COMMAND_MODULES if command in commands]
    for module_name in owners or [module for module, _ in COMMAND_MODULES]:
        importlib.import_module(module_name).register(subparsers)
    return parser


def _command_word(argv: Sequence[str]) -> str | None:
    """The command a line starts with; None when it starts with an option (``hpcrl --help``,
    ``hpcrl -h validate``: the whole parser answers) or is empty."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like ``parse_args``, but overrides may also follow the options, in every form
    (``a=1``, ``~a``, ``+a=1``, ``++a=1``): ``hpcrl.cli.arguments``. Words that only look
    like overrides (``--a.b=1``, ``a.b`` without a value) are kept in ``override_mistakes``."""
    from hpcrl.cli.arguments import override_word_problems, place_extras

    args, extras = parser.parse_known_args(argv)
    dashed = place_extras(parser, args, extras)
    overrides = getattr(args, "overrides", [])
    args.override_mistakes = override_word_problems(args.command, overrides, dashed)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error ends as a message and an exit code (hpcrl.cli.failures),
    except with ``--debug`` (anywhere on the line) or ``HPCRL_DEBUG=1``, which raise it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv or os.environ.get("HPCRL_DEBUG") == "1"
    words = [arg for arg in argv if arg != DEBUG_FLAG]
    parser = build_parser(_command_word(words))
    args = parse_args(parser, words)
    try:
        if args.override_mistakes:
            from hpcrl.config.errors import ConfigError

            raise ConfigError(args.override_mistakes)
        if getattr(args, "needs_cluster", False) and args.cluster is None:
            args.cluster = _default_cluster()
        if args.command not in SHORT_COMMANDS:
            _collector_back_on()
        return int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as error:
        if debug:
            raise
        from hpcrl.cli.failures import report_failure  # after parsing: `--help` stays light

        return report_failure(args.command, error)


def run() -> NoReturn:
    """The ``hpcrl`` script (and ``python -m hpcrl.cli.main``): ``main`` with the cyclic
    garbage collector off while the command starts. Loading the config classes, OmegaConf
    and a recipe allocates ~300k objects that live to the end, and the collector walked them
    ~70 times (~10 ms of a validate here: docs/performance.md, item 6); nothing a short
    command builds needs collecting before its process ends. ``main`` itself (tests, other
    callers in a process of their own) leaves the collector as it finds it.

    At the end everything is frozen (``gc.freeze``): the interpreter's exit still runs the
    atexit handlers and frees the modules, but its last full collection no longer walks
    every object the command made (~12 ms of a validate here)."""
    gc.disable()
    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)


def _collector_back_on() -> None:
    """A longer command's collector, on again if ``run`` turned it off: what start-up loaded
    is moved out of its reach first (``gc.freeze``), so the first collection does not walk
    all of it."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _default_cluster() -> str:
    """``--cluster`` left out: the user's default profile (hpcrl.cli.user_config)."""
    from hpcrl.cli.user_config import default_cluster, no_cluster_error

    cluster, _ = default_cluster()
    if cluster is None:
        raise no_cluster_error()
    return cluster


if __name__ == "__main__":
    run()
