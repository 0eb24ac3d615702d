"""A stand-in for sbatch's reading of one ``#SBATCH`` argument, for tests without Slurm.

Mirrors the loop in Slurm's ``src/sbatch/opt.c`` (``_get_argument``): quotes ``'`` and ``"``
group text, a backslash escapes the next character everywhere (also inside single quotes),
an unquoted ``#`` starts a comment, whitespace ends the argument. ``test_sbatch_parsing.py``
checks it against the real sbatch on the test cluster.
"""

from __future__ import annotations


def parse_sbatch_argument(text: str) -> str:
    """The first argument of ``text`` (the part after ``#SBATCH ``) as sbatch reads it."""
    argument: list[str] = []
    quote_char: str | None = None
    escaped = False
    for char in text.lstrip():
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
            continue
        elif quote_char is not None:
            if char == quote_char:
                quote_char = None
                continue
        elif char in "'\"":
            quote_char = char
            continue
        elif char == "#" or char.isspace():
            break
        argument.append(char)
    return "".join(argument)
