"""``label  value`` lines for a terminal: long values wrapped at spaces under themselves, a
word longer than the line (a path, a command) kept whole on a line of its own. Used by
``hpcrl validate`` (the plan) and ``hpcrl status RUN`` (one run); only textwrap is imported."""

from __future__ import annotations

import textwrap

#: The narrowest a wrapped value gets, however long its label.
MIN_VALUE_WIDTH = 20


def wrap_field(label: str, value: str, width: int | None, label_width: int = 10) -> list[str]:
    """``label  value``, the value wrapped at spaces to ``width`` (None: one line per line of
    the value); each line of a multi-line value starts a line of its own."""
    head = f"{label:<{label_width}} "
    indent = " " * len(head)
    lines: list[str] = []
    for paragraph in value.splitlines() or [""]:
        first = head if not lines else indent
        if width is None:
            lines.append(first + paragraph)
            continue
        lines += textwrap.wrap(
            paragraph, width=max(width, len(head) + MIN_VALUE_WIDTH), initial_indent=first,
            subsequent_indent=indent, break_long_words=False, break_on_hyphens=False,
        ) or [first]  # fmt: skip
    return [line.rstrip() for line in lines]
