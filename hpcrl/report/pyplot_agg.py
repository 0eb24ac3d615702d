"""matplotlib's pyplot on the Agg backend, imported when a plot is drawn: the report must work
on a login node without a display, and importing hpcrl must not pay for matplotlib."""

from __future__ import annotations

from typing import Any


def agg_pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    return pyplot
