"""Overrides anywhere on the command line, and the words that only look like them.

argparse fills a ``nargs="*"`` positional in one go, so in ``render R --cluster C a=1 ~b`` the
words after the options are left over; ``place_extras`` puts every one of them that is not an
option (``a=1``, ``~b``, ``+c=2``, ``++d=3``, and a bare ``e`` whose mistake the override check
names) into ``overrides``, in order. ``override_word_problems`` names the mistakes argparse
would only answer with its usage line: ``key`` without ``=``, ``key = value`` with spaces,
``--key=value`` with dashes. Only plain strings here: nothing is imported at startup.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrl.config.errors import Problem

#: A dotted key as an override names it, with Hydra's prefixes (+, ++, ~).
OVERRIDE_KEY = re.compile(r"(?:\+\+|\+|~)?[A-Za-z0-9_][\w-]*(?:\.[A-Za-z0-9_][\w-]*)*")
#: ``--a.b=1``, ``--a.b``, ``-a.b=1``: an override typed as an option.
DASHED_OVERRIDE = re.compile(
    r"--?(?P<key>[A-Za-z0-9_][\w-]*(?:\.[A-Za-z0-9_][\w-]*)*)(?P<rest>=.*)?"
)


def place_extras(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extras: Sequence[str]
) -> list[str]:
    """Append the left-over words that are not options to ``args.overrides``; return the
    options argparse did not know (each reported by ``override_word_problems`` when it looks
    like an override, by argparse otherwise)."""
    if not hasattr(args, "overrides"):
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return []
    words = [word for word in extras if not word.startswith("-")]
    options = [word for word in extras if word.startswith("-")]
    strays = [word for word in options if not _is_dashed_override(word)]
    if strays:
        parser.error(f"unrecognized arguments: {' '.join(strays)}")
    args.overrides = [*args.overrides, *words]
    return options


def _is_dashed_override(word: str) -> bool:
    match = DASHED_OVERRIDE.fullmatch(word)
    return match is not None and ("." in match["key"] or match["rest"] is not None)


def override_word_problems(
    command: str, overrides: Sequence[str], dashed: Sequence[str]
) -> list[Problem]:
    """What is wrong with each word given as an override, and the form to write instead."""
    from hpcrl.config.errors import Problem

    problems = [
        Problem(
            path="<override>",
            value=word,
            message=f"{word} is not an option of hpcrl {command}: overrides have no dashes",
            fix=f"write {word.lstrip('-')}" + ("" if "=" in word else "=VALUE"),
        )  # fmt: skip
        for word in dashed
    ]
    index = 0
    while index < len(overrides):
        word = overrides[index]
        following = overrides[index + 1 :]
        if "=" in word or word.startswith("~") or not OVERRIDE_KEY.fullmatch(word):
            index += 1
            continue  # a whole override, a deletion, or text the override parser explains
        value, used = _value_after(following)
        if value is None:
            fix = f"write {word}=VALUE (or ~{word.lstrip('+')} to delete the key)"
        else:
            fix = f"write {word}={value} (no spaces around '=')"
        problems.append(
            Problem(
                path="<override>",
                value=" ".join([word, *following[:used]]),
                message=f"{word!r} has no '=': an override is KEY=VALUE, one word",
                fix=fix,
            )  # fmt: skip
        )
        index += 1 + used
    return problems


def _value_after(following: Sequence[str]) -> tuple[str | None, int]:
    """The value a user meant after a bare key (``key value``, ``key = value``, ``key =value``)
    and how many words it took; (None, 0) when the next word is an override of its own."""
    if not following:
        return None, 0
    first = following[0]
    if first == "=" and len(following) > 1:
        return following[1], 2
    if first.startswith("=") and len(first) > 1:
        return first[1:], 1
    if "=" in first or first.startswith("~") or first.startswith("+"):
        return None, 0
    return first, 1
