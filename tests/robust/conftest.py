"""Print the corpus size by family at the end of every run that collected it."""

from __future__ import annotations

from collections import Counter


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from tests.robust import test_corpus

    counts = Counter(case.family for case in test_corpus.CORPUS)
    terminalreporter.write_line(
        f"bad-input corpus: {len(test_corpus.CORPUS)} cases "
        + ", ".join(f"{family} {count}" for family, count in sorted(counts.items()))
    )
