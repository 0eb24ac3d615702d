"""The injection tests' example counts: 25 locally, 300 under CI or any require flag (so CI
cannot quietly fall back to the local count), and the long-run script really runs and counts
the number it is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.render import fuzz_injection
from tests.require import FLAGS

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plain_env(monkeypatch):
    """No CI, no require flag, no explicit count: a developer's local run."""
    for name in ("CI", fuzz_injection.EXAMPLES_VAR, *FLAGS.values()):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_local_count_is_25(plain_env):
    assert fuzz_injection.injection_examples() == 25


@pytest.mark.parametrize("variable", ["CI", *FLAGS.values()])
def test_ci_and_every_require_flag_run_300(plain_env, variable):
    plain_env.setenv(variable, "true" if variable == "CI" else "1")
    assert fuzz_injection.injection_examples() == 300


def test_an_explicit_count_wins(plain_env):
    plain_env.setenv("CI", "true")
    plain_env.setenv(fuzz_injection.EXAMPLES_VAR, "7")
    assert fuzz_injection.injection_examples() == 7


def test_injection_tests_use_the_count():
    """The settings test_injection.py applies were built from ``injection_examples()`` in
    this very process (same environment)."""
    from tests.render import test_injection

    assert test_injection.SETTINGS.max_examples == fuzz_injection.injection_examples()


def test_long_run_script_counts_the_examples_it_ran():
    """``python -m tests.render.fuzz_injection --examples 5``: each counted test really ran 5
    examples (counted inside the test bodies), and the script says so."""
    env = {k: v for k, v in os.environ.items() if k != fuzz_injection.COUNT_DIR_VAR}
    done = subprocess.run(
        [sys.executable, "-m", "tests.render.fuzz_injection", "--examples", "5"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for test in fuzz_injection.COUNTED_TESTS:
        assert f"{test}: 5 examples executed (asked 5)" in done.stdout
    assert "total: 15 examples in" in done.stdout
