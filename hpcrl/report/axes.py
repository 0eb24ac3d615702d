"""The decisions behind the report's axes and markers, as data (the plots only apply them):

- a swept value is a category unless every value is a number; numbers spanning a decade or
  more (learning rates 1e-5 .. 1e-3) get a log axis;
- a metric whose values differ by less than ``FLAT_SPREAD`` of their size is drawn from zero,
  and its panel says the relative spread: 2.001 s against 2.002 s is no cliff;
- step axes take integer ticks only;
- a point that did not complete (failed, cancelled, timed out) is drawn, marked with a red
  cross; a point that shared a node with another running point is drawn hollow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

#: Relative spread (max - min) / max below which an axis starts at zero.
FLAT_SPREAD = 0.1
#: A ratio max / min from which positive swept values get a log axis.
LOG_RATIO = 10.0
#: Point states drawn as they are; anything else (FAILED, CANCELLED, TIMEOUT, ...) is marked.
FINE_STATES = frozenset({"COMPLETED", "RUNNING", "PENDING", "UNKNOWN", "NOT_SUBMITTED", ""})


@attrs.frozen
class SweptAxis:
    """How to draw a swept key: ``scale`` "log", "linear" or "category"; ``xs`` per point;
    ``integer``: every value is a whole number (seeds, batch sizes): ticks at whole numbers."""

    scale: str
    xs: tuple[float, ...]
    labels: tuple[str, ...]
    integer: bool = False


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def swept_axis(labels: Sequence[str]) -> SweptAxis:
    numbers = [_number(label) for label in labels]
    if not labels or any(number is None for number in numbers):
        return SweptAxis("category", tuple(float(i) for i in range(len(labels))), tuple(labels))
    values = [number for number in numbers if number is not None]
    positive = all(value > 0 for value in values)
    scale = "log" if positive and max(values) / min(values) >= LOG_RATIO else "linear"
    integer = all(value.is_integer() for value in values)
    return SweptAxis(scale, tuple(values), tuple(labels), integer=integer)


#: An integer axis with at most this many values gets a tick at each value (more: whole
#: numbers matplotlib chooses).
MAX_VALUE_TICKS = 12


def apply_integer_ticks(axes: object, swept: SweptAxis) -> None:
    """Whole-number ticks for an integer swept axis: one per value when they are few (a log
    axis too: 16, 32, 64, ... rather than 10^1.5), else integer-only ticks."""
    from matplotlib.ticker import NullLocator

    if not swept.integer:
        return
    if len(set(swept.xs)) <= MAX_VALUE_TICKS:
        axes.set_xticks(sorted(set(swept.xs)), [f"{x:g}" for x in sorted(set(swept.xs))])  # type: ignore[attr-defined]
        axes.xaxis.set_minor_locator(NullLocator())  # type: ignore[attr-defined]
    else:
        integer_ticks(axes.xaxis)  # type: ignore[attr-defined]


@attrs.frozen
class ValueAxis:
    """``limits``: (low, high) to set, or None for matplotlib's own; ``note``: e.g.
    ``spread 0.05%`` for the panel title when the values are nearly equal."""

    limits: tuple[float, float] | None
    note: str


def value_axis(values: Sequence[float]) -> ValueAxis:
    finite = [value for value in values if math.isfinite(value)]
    if len(finite) < 2 or min(finite) < 0 or max(finite) == 0:
        return ValueAxis(None, "")
    spread = (max(finite) - min(finite)) / max(finite)
    if spread >= FLAT_SPREAD:
        return ValueAxis(None, "")
    return ValueAxis((0.0, max(finite) * 1.15), f"spread {spread:.2%}")


@attrs.frozen
class PointStyle:
    """matplotlib keyword arguments for one point's marker, and why (for the legend)."""

    marker: str
    facecolor: str  # "none": hollow
    edgecolor: str
    why: str = ""


def point_style(state: str, shared_node: bool, color: str) -> PointStyle:
    if state.upper() not in FINE_STATES:
        return PointStyle("X", "red", "red", why=state.lower())
    if shared_node:
        return PointStyle("o", "none", color, why="shared a node")
    return PointStyle("o", color, color)


def integer_ticks(axis: object) -> None:
    """Steps are whole numbers: no 2.5 on a step axis."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))  # type: ignore[attr-defined]
