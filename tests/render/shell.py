"""Checks every rendered script goes through: ``bash -n`` and shellcheck (Debian package)."""

from __future__ import annotations

import shutil
import subprocess

from tests.require import unavailable

SHELLCHECK_TIMEOUT_S = 60


def assert_bash_parses(text: str) -> None:
    result = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"bash -n failed:\n{result.stderr}\n--- script ---\n{text}"


def assert_shellcheck_clean(text: str) -> None:
    """shellcheck with no findings; fails (not skips) under CI when shellcheck is missing."""
    executable = shutil.which("shellcheck")
    if executable is None:
        unavailable("deps", "shellcheck is not installed: apt-get install -y shellcheck")
    result = subprocess.run(
        [executable, "--shell=bash", "--severity=style", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=SHELLCHECK_TIMEOUT_S,
    )
    assert result.returncode == 0, f"shellcheck findings:\n{result.stdout}{result.stderr}"
