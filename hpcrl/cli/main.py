"""The ``hpcrl`` command: an argparse dispatcher over the command modules.

Each module in ``COMMAND_MODULES`` exposes ``register(subparsers)`` and sets ``func`` on every
subcommand it adds. Modules import their stages inside ``func``, so ``hpcrl --help`` loads
nothing but argparse and the command modules themselves.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = ("hpcrl.cli.prepare", "hpcrl.cli.jobs", "hpcrl.cli.report")


def build_parser() -> argparse.ArgumentParser:
    from hpcrl import __version__

    parser = argparse.ArgumentParser(
        prog="hpcrl",
        description="Recipe + cluster profile -> checked plan -> sbatch script -> Slurm job.",
    )
    parser.add_argument("--version", action="version", version=f"hpcrl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like ``parse_args``, but ``key=value`` overrides may also follow the options.

    argparse fills a ``nargs="*"`` positional in one go, so in ``render R --cluster C a=1`` the
    ``a=1`` would be left over; it is appended to ``overrides`` here instead.
    """
    args, extras = parser.parse_known_args(argv)
    if extras and hasattr(args, "overrides"):
        misplaced = [arg for arg in extras if arg.startswith("-") or "=" not in arg]
        if misplaced:
            parser.error(f"unrecognized arguments: {' '.join(misplaced)}")
        args.overrides = [*args.overrides, *extras]
    elif extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    from hpcrl.config.errors import ConfigError  # after parsing: `hpcrl --help` stays light

    try:
        return int(args.func(args) or 0)
    except ConfigError as error:
        from hpcrl.config.errors import print_problems

        print_problems(error.problems)
        return 2


if __name__ == "__main__":
    sys.exit(main())
