"""How many hypothesis examples the injection tests run, and a long run that counts them.

The tests in ``test_injection.py`` run ``injection_examples()`` examples each: 25 locally (a
quick check while editing), ``CI_EXAMPLES`` under CI (tests/require.py: ``CI`` or a require
flag), or ``$HPCRL_INJECTION_EXAMPLES`` when set. The long run, outside the suite:

    .venv/bin/python -m tests.render.fuzz_injection --examples 10000

runs the same tests with 10,000 examples each and prints how many examples every test really
executed (counted inside the test bodies, not taken from the setting); it exits non-zero when
a test fails or ran fewer examples than asked.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from tests.require import under_ci

LOCAL_EXAMPLES = 25
CI_EXAMPLES = 300
EXAMPLES_VAR = "HPCRL_INJECTION_EXAMPLES"
COUNT_DIR_VAR = "HPCRL_INJECTION_COUNT_DIR"
TEST_FILE = Path(__file__).with_name("test_injection.py")
COUNTED_TESTS = ("pyxis", "local", "names")


def injection_examples() -> int:
    if os.environ.get(EXAMPLES_VAR):
        return int(os.environ[EXAMPLES_VAR])
    return CI_EXAMPLES if under_ci() else LOCAL_EXAMPLES


def count_example(test: str) -> None:
    """One executed example of ``test`` (recorded only during a counted run)."""
    count_dir = os.environ.get(COUNT_DIR_VAR)
    if count_dir:
        with open(Path(count_dir) / test, "a") as counts:
            counts.write(".")


def counted_run(examples: int, pytest_args: list[str]) -> tuple[int, dict[str, int], float]:
    """(pytest exit code, examples executed per test, seconds) of one run with ``examples``."""
    import pytest

    with tempfile.TemporaryDirectory(prefix="hpcrl-fuzz-") as count_dir:
        os.environ[EXAMPLES_VAR] = str(examples)
        os.environ[COUNT_DIR_VAR] = count_dir
        started = time.monotonic()
        code = pytest.main(
            [str(TEST_FILE), "-q", "-p", "no:cacheprovider", "-k", "injected or identifiers"]
            + pytest_args
        )
        elapsed_s = time.monotonic() - started
        counts = {
            test: len((Path(count_dir) / test).read_text())
            if (Path(count_dir) / test).exists()
            else 0
            for test in COUNTED_TESTS
        }
    return int(code), counts, elapsed_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="examples per test")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest")
    args = parser.parse_args(argv)
    code, counts, elapsed_s = counted_run(args.examples, args.pytest_args)
    for test, count in counts.items():
        print(f"{test}: {count} examples executed (asked {args.examples})")
    total = sum(counts.values())
    print(f"total: {total} examples in {elapsed_s:.0f} s, pytest exit code {code}")
    short = [test for test, count in counts.items() if count < args.examples]
    if short:
        print(f"fewer examples than asked: {', '.join(short)}", file=sys.stderr)
    return code or (1 if short else 0)


if __name__ == "__main__":
    sys.exit(main())
