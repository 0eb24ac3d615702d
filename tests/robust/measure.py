"""Run the whole corpus outside pytest and count what it finds, by family and by kind.

    .venv/bin/python -m tests.robust.measure [--deadline-s S] [--family F]

Prints one line per case that has findings and a table of counts (tracebacks, hangs, leaks,
wrong accepts, rejections that do not name the key). Used to measure hpcrl before and after
a change (point PYTHONPATH at another checkout's hpcrl to measure that one).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import Counter
from pathlib import Path

import attrs

from hpcrl.cli.main import main
from hpcrl.config import load_recipe
from tests.robust.corpus import RECIPE, build_corpus
from tests.robust.harness import case_environment, findings, run_case, short_waits

KINDS = ("traceback", "hang", "leak", "wrong accept", "wrong reject", "rejection names none",
         "internal error", "output does not say")  # fmt: skip


def kind_of(finding: str) -> str:
    return next((kind for kind in KINDS if finding.startswith(kind)), finding.split(":")[0])


def measure(deadline_s: float | None, family: str | None) -> Counter:
    import hpcrl

    print(f"hpcrl from {Path(hpcrl.__file__).parent}")
    cases = [
        c for c in build_corpus(load_recipe(RECIPE).resolved_dict) if family in (None, c.family)
    ]
    counts: Counter = Counter()
    short_waits(setattr)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        for index, case in enumerate(cases):
            if deadline_s is not None:
                case = attrs.evolve(case, deadline_s=deadline_s)
            folder = Path(scratch) / f"c{index}"
            folder.mkdir()
            os.environ.update(
                {k: v for k, v in case_environment(folder, case.sacct).items() if k != "PYTHONPATH"}
            )
            os.environ.pop("HPCRL_CLUSTER_PROFILES", None)
            os.chdir(folder)
            try:
                found = findings(case, run_case(case, folder, main))
            finally:
                os.chdir(saved_cwd)
                os.environ.clear()
                os.environ.update(saved_env)
            counts[(case.family, "cases")] += 1
            for kind in sorted({kind_of(f) for f in found}):
                counts[(case.family, kind)] += 1
            if found:
                print(f"{case.id}: {' | '.join(f[:160] for f in found)}", flush=True)
    return counts


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deadline-s", type=float)
    parser.add_argument("--family")
    args = parser.parse_args(argv)
    counts = measure(args.deadline_s, args.family)
    families = sorted({family for family, _ in counts})
    kinds = sorted({kind for _, kind in counts if kind != "cases"})
    print("\n" + "family".ljust(14) + "cases".rjust(7) + "".join(k.rjust(22) for k in kinds))
    for family in families + ["total"]:
        row = [
            counts[(f, k)]
            for f in (families if family == "total" else [family])
            for k in ["cases", *kinds]
        ]
        per = [sum(row[i :: len(kinds) + 1]) for i in range(len(kinds) + 1)]
        print(family.ljust(14) + str(per[0]).rjust(7) + "".join(str(n).rjust(22) for n in per[1:]))


if __name__ == "__main__":
    main_()
