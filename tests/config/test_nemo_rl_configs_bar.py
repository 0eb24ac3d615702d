"""Issue 24's bar, run by CI: NeMo RL's own GRPO and SFT example configs of every supported
release (the snapshots in ../shared/nemo-rl: tests/nemo_rl_snapshots.py; under CI a missing
one fails) go through ``hpcrl render --cluster eos`` unmodified, in this process
(benchmarks/nemo_rl_configs.py, render alone: it validates first with the same code).

Held hard: no traceback; every config refused is refused by a problem that names its path,
reason and fix (never an unknown key: the key registry knows every key NeMo RL ships); the
number that renders never falls below what it is today (``FLOOR``). The issue's 95% is its
own test, an expected failure until the features the refusals name are built: strict, so
the day it holds the marker must go.

Slow (about a minute on the 2-core machine: each config is loaded and planned, the ones
that pass are rendered to a temporary folder): the only test that reads every config of
every release, which is the point.
"""

from __future__ import annotations

import re

import pytest

from benchmarks.nemo_rl_configs import Outcome, run_all, share_passed
from tests.nemo_rl_snapshots import RELEASES, release_root

pytestmark = pytest.mark.slow

BAR = 0.95
#: How many GRPO/SFT configs of each release rendered when this was last set (of 105,
#: 177 and 207): it may only grow; raise it when a feature lands. (Lowered once, from 80,
#: 118, 123, when validate learnt the architectures of NeMo RL's models from hpcrl's table:
#: configs whose model hpcrl cannot build had passed because their config.json was not here.)
FLOOR = {"v0.5.0": 96, "v0.7.0": 149, "main-7ea279a": 159}
#: ``Problem.format()`` on one line: ``error: PATH [= VALUE]: REASON fix: FIX``
REFUSAL = re.compile(r"^error: (?P<path>[\w.\-\[\]]+)( = .+?)?: (?P<reason>.+) fix: (?P<fix>.+)$")


@pytest.fixture(scope="module", params=RELEASES)
def outcomes(request) -> tuple[str, list[Outcome]]:
    return request.param, run_all(release_root(request.param), "eos", validate=False)


def _failed(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.validate_rc is not None and not o.passed]


def test_no_config_ends_in_a_traceback(outcomes):
    release, results = outcomes
    assert [o.config for o in results if o.traceback] == [], release


def test_every_refusal_names_path_reason_and_fix(outcomes):
    release, results = outcomes
    bad = [
        f"{o.config}: {o.first_error}"
        for o in _failed(results)
        if not REFUSAL.match(o.first_error) or "unknown key" in o.first_error
    ]
    assert bad == [], release


def test_no_fewer_configs_render_than_before(outcomes):
    release, results = outcomes
    passed, counted = share_passed(results)
    assert counted > 50, f"{release}: only {counted} GRPO/SFT configs found"
    assert passed >= FLOOR[release], f"{release}: {passed}/{counted}"


@pytest.mark.xfail(
    strict=True,
    reason="issue 24: FP8, MTP, vLLM expert parallelism, DeepEP, other generation backends "
    "and models the Automodel backend cannot build are refused: the bar is not met yet",
)
def test_95_percent_of_grpo_and_sft_configs_render(outcomes):
    release, results = outcomes
    passed, counted = share_passed(results)
    assert passed >= BAR * counted, f"{release}: {passed}/{counted}"
