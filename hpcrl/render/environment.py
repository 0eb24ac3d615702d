"""The one Jinja environment that renders hpcrl's shell scripts.

Values reach a script only through the ``q`` filter (``shlex.quote``) and its two variants:
``q_sbatch`` for ``#SBATCH`` lines (sbatch's parser also unescapes backslashes) and
``q_comment`` for comment lines (line breaks escaped so a value cannot end the comment).
The only unquoted text is hpcrl's own template text, numbers and names hpcrl computes
(node counts, the layout line, ``grpo``/``megatron``; all in comments), and the profile's
``setup_lines``, which are shell by design (``raw_shell`` marks them).
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterable

import jinja2

from hpcrl.config.locate import shipped_templates_dir


def quote(value: object) -> str:
    """Shell-quote one value; the only way a value enters a rendered script."""
    assert isinstance(value, str | int), f"refusing to quote {type(value).__name__}: {value!r}"
    return shlex.quote(str(value))


def quote_sbatch(value: object) -> str:
    """Quote an ``#SBATCH`` value. sbatch's own parser honours shell quotes but treats a
    backslash as an escape even inside single quotes, so backslashes are doubled."""
    return quote(value).replace("\\", "\\\\")


def quote_comment(value: object) -> str:
    """Quote for a comment line: line breaks and other control characters become escapes."""
    quoted = quote(value)
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in quoted)


def join_quote_comment(values: Iterable[object]) -> str:
    return " ".join(quote_comment(value) for value in values)


def raw_shell(line: str) -> str:
    """Mark a line that is shell by design (a profile's setup line); it must be one line."""
    assert "\0" not in line, "the planner rejects NUL bytes in setup lines"
    return line


@functools.cache  # one environment per process: templates are loaded and compiled once
def environment() -> jinja2.Environment:
    templates = shipped_templates_dir()
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(
        q=quote,
        q_sbatch=quote_sbatch,
        q_comment=quote_comment,
        join_q_comment=join_quote_comment,
        raw_shell=raw_shell,
    )
    return env
