"""The bad-input corpus (tests/robust/corpus.py) through the real ``hpcrl`` command.

Each case runs in-process (``hpcrl.cli.main.main``) in a folder of its own, with secrets in
the environment and scheduler stand-ins on PATH, and must end without a traceback, within
its deadline, without a secret in the output or in a file it wrote, and, when it is
rejected, naming the key. A sample also goes through the installed ``hpcrl`` entry point.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from hpcrl.config import load_recipe
from tests.robust.corpus import build_corpus
from tests.robust.corpus_runs import RECIPE
from tests.robust.harness import (
    SECRET_VALUES,
    Case,
    case_environment,
    findings,
    run_case,
    short_waits,
)

CORPUS = build_corpus(load_recipe(RECIPE).resolved_dict)
#: Cases that also run through the real entry point (a new interpreter each: kept few).
ENTRY_POINT_SAMPLE = CORPUS[:: max(1, len(CORPUS) // 12)]


@pytest.fixture
def case_folder(tmp_path, monkeypatch):
    folder = tmp_path / "case"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.mark.parametrize("case", CORPUS, ids=[case.id for case in CORPUS])
def test_bad_input(case: Case, case_folder: Path, monkeypatch) -> None:
    for name, value in case_environment(case_folder, case.sacct).items():
        if name != "PYTHONPATH":
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("HPCRL_CLUSTER_PROFILES", raising=False)
    monkeypatch.delenv("HPCRL_DEBUG", raising=False)
    short_waits(monkeypatch.setattr)
    outcome = run_case(case, case_folder, main)
    assert findings(case, outcome) == []


@pytest.mark.parametrize("case", ENTRY_POINT_SAMPLE, ids=[c.id for c in ENTRY_POINT_SAMPLE])
def test_bad_input_through_the_entry_point(case: Case, case_folder: Path) -> None:
    if case.setup is not None:
        case.setup(case_folder)
    argv = [arg.replace("{case}", str(case_folder)) for arg in case.argv]
    env = case_environment(case_folder, case.sacct)
    command = [
        sys.executable,
        "-c",
        "import sys; from hpcrl.cli.main import main; sys.exit(main())",
        *argv,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=case_folder,
                            timeout=case.deadline_s + 30, errors="replace")  # fmt: skip
    output = result.stdout + result.stderr
    assert "Traceback (most recent call last)" not in output, output
    assert "internal error" not in output, output
    assert not [value for value in SECRET_VALUES if value in output]
    assert result.returncode in (0, 1, 2), output


def test_corpus_size():
    counts = Counter(case.family for case in CORPUS)
    print(f"\nbad-input corpus: {len(CORPUS)} cases ({dict(sorted(counts.items()))})")
    assert len(CORPUS) >= 500
    assert set(counts) == {"recipes", "profiles", "overrides", "run-folders", "metrics",
                           "job-records", "cli-arguments"}  # fmt: skip
