"""``hpcrl status`` as lines that fit the terminal: one line per run, whatever its width.

Columns are plain text separated by two spaces (no box: a box costs three columns per
cell). When the natural widths do not fit, ``fit_columns`` keeps the most needed columns
(run, state, step, cause, exit, reward, ...) that fit, long causes cut with an ellipsis. A
run name is never wrapped; when even it and the state do not fit, its middle goes
(``grpo-qwen2-…-eos-401fdb21``), so its start and its hash stay. A line under the table names
what was left out and how to see it (``--wide``, ``hpcrl status RUN``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

ELLIPSIS = "…"
GAP = "  "
NUMERIC = frozenset({"exit", "attempts", "step", "reward", "loss", "elapsed"})
#: Most needed first: a column is kept when it fits beside the ones before it.
PRIORITY = ("run", "state", "step", "cause", "exit", "reward", "loss", "values", "job",
            "elapsed", "attempts")  # fmt: skip
#: Columns that may be cut, the narrowest each is cut to, in the order they get space back.
CUT_TO = {"run": 16, "state": 13, "cause": 16, "values": 12}  # state: "not submitted"


@attrs.frozen(kw_only=True)
class FittedTable:
    """The lines to print; what was cut (columns with a shortened cell) and left out."""

    lines: tuple[str, ...]
    cut: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()


def cut_text(text: str, width: int, middle: bool = False) -> str:
    """``text`` in at most ``width`` characters: its end replaced by an ellipsis, or with
    ``middle``, its middle (the start and end of a run name both say which run it is)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    if not middle:
        return text[: width - 1].rstrip() + ELLIPSIS
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + ELLIPSIS + text[len(text) - tail :]


def natural_widths(columns: Sequence[str], rows: Sequence[Mapping[str, str]]) -> dict[str, int]:
    return {
        column: max([len(column), *(len(row.get(column, "")) for row in rows)])
        for column in columns
    }


def fit_columns(
    columns: Sequence[str], rows: Sequence[Mapping[str, str]], width: int | None
) -> tuple[list[str], dict[str, int]]:
    """The columns kept (table order) and each one's width, so that a line is at most
    ``width`` long (None: all, at their natural widths). Columns are taken in ``PRIORITY``
    order at their narrowest (``CUT_TO``; the run name whole unless the line cannot hold it
    and the state), each when it still fits; the space left goes back to the cut columns."""
    natural = natural_widths(columns, rows)
    if width is None:
        return list(columns), natural
    narrowest = {
        column: min(natural[column], max(CUT_TO.get(column, natural[column]), len(column)))
        for column in columns
    }
    narrowest["run"] = natural["run"]
    beside_run = narrowest.get("state", 0) + len(GAP) if "state" in columns else 0
    if narrowest["run"] + beside_run > width:
        narrowest["run"] = max(CUT_TO["run"], width - beside_run)
    kept: list[str] = []
    used = -len(GAP)
    for column in sorted(columns, key=_priority):
        if column == "run" or used + len(GAP) + narrowest[column] <= width:
            kept.append(column)
            used += len(GAP) + narrowest[column]
    widths = {column: narrowest[column] for column in kept}
    spare = width - used
    for column in (column for column in CUT_TO if column in kept):
        grow = max(0, min(spare, natural[column] - widths[column]))
        widths[column] += grow
        spare -= grow
    return [column for column in columns if column in kept], widths


def _priority(column: str) -> int:
    return PRIORITY.index(column) if column in PRIORITY else len(PRIORITY)


def _cell(text: str, column: str, width: int) -> str:
    text = cut_text(text, width, middle=column == "run")
    return text.rjust(width) if column in NUMERIC else text.ljust(width)


def render_table(
    columns: Sequence[str], rows: Sequence[Mapping[str, str]], width: int | None
) -> FittedTable:
    """A header line and one line per row, each at most ``width`` characters (trailing
    spaces removed)."""
    kept, widths = fit_columns(columns, rows, width)
    natural = natural_widths(columns, rows)
    lines = [GAP.join(_cell(column, column, widths[column]) for column in kept).rstrip()]
    for row in rows:
        cells = [_cell(row.get(column, ""), column, widths[column]) for column in kept]
        lines.append(GAP.join(cells).rstrip())
    return FittedTable(
        lines=tuple(lines),
        cut=tuple(column for column in kept if widths[column] < natural[column]),
        dropped=tuple(column for column in columns if column not in kept),
    )


def fitting_note(table: FittedTable, wide_command: str, width: int | None) -> list[str]:
    """Lines naming what the table cut or left out, and the command that shows it all (on a
    line of its own when one line would be too long: a command is never wrapped)."""
    if not table.cut and not table.dropped:
        return []
    parts = []
    if table.dropped:
        parts.append(f"left out: {', '.join(table.dropped)}")
    if table.cut:
        parts.append(f"cut short: {', '.join(table.cut)}")
    what = f"({'; '.join(parts)})"
    line = f"{what} in full: {wide_command}"
    if width is None or len(line) <= width:
        return [line]
    return [cut_text(what, width), f"in full: {wide_command}"]
