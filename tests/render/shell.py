"""Checks every rendered script goes through: ``bash -n`` and shellcheck (Debian package)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SHELLCHECK_TIMEOUT_S = 60


def assert_bash_parses(text: str) -> None:
    result = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"bash -n failed:\n{result.stderr}\n--- script ---\n{text}"


def assert_shellcheck_clean(text: str) -> None:
    """shellcheck with no findings; fails (not skips) in CI when shellcheck is missing."""
    executable = shutil.which("shellcheck")
    if executable is None:
        message = "shellcheck is not installed: apt-get install -y shellcheck"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run(
        [executable, "--shell=bash", "--severity=style", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=SHELLCHECK_TIMEOUT_S,
    )
    assert result.returncode == 0, f"shellcheck findings:\n{result.stdout}{result.stderr}"
