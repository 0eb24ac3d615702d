"""How wide the commands' output is: the terminal's columns, or a fixed width when piped."""

from __future__ import annotations

import shutil

#: Piped output (no terminal, no $COLUMNS) gets this width instead of 80 columns, so tables
#: and paths are not cut short in logs and CI output.
PIPED_WIDTH = 200


def output_width() -> int:
    """The terminal's columns ($COLUMNS first); ``PIPED_WIDTH`` without a terminal."""
    return shutil.get_terminal_size((PIPED_WIDTH, 24)).columns
