"""The Megatron backend trains the same under TP=2, PP=2, DP=2 + distributed optimizer and the
2-D TP=2 × DP=2 (4 ranks) as at TP=PP=DP=1 (real megatron-core on gloo, hpcrl's CPU compatibility layer)."""

from __future__ import annotations

import pytest

from tests.megatron import harness

# Spawns gloo ranks that build real megatron-core models: minutes on the 2-core machine.
pytestmark = pytest.mark.slow

STEPS = 4


@pytest.fixture(scope="module")
def reference_run(converted):
    hf_path, root = converted
    return harness.run_ranks(1, harness.train_run, {}, hf_path, root, STEPS)[0]


def _losses(result):
    return [step["loss"] for step in result["history"]]


def test_single_rank_learns(reference_run):
    losses = _losses(reference_run)
    assert (
        all(b < a for a, b in zip(losses, losses[1:], strict=False))
        and losses[-1] < losses[0] * 0.95
    ), losses
    assert all(step["grad_norm"] > 0 for step in reference_run["history"])
    assert reference_run["place"] == (0, 1, True)
    for figures in reference_run["passes"]:  # the train pass's split is recorded (was 0 + 0)
        fwd_bwd_s = figures["time_train_forward_backward_s"]
        optimizer_s = figures["time_train_optimizer_s"]
        assert fwd_bwd_s > 0 and optimizer_s > 0, figures
        assert fwd_bwd_s + optimizer_s <= figures["time_train_worker_s"], figures


@pytest.mark.parametrize(
    ("world_size", "layout", "dp_size"),
    [
        pytest.param(2, {"tp": 2}, 1, id="tp2"),
        pytest.param(2, {"pp": 2}, 1, id="pp2"),
        pytest.param(2, {"dist_opt": True}, 2, id="dp2-distributed-optimizer"),
        pytest.param(4, {"tp": 2}, 2, id="tp2-dp2-distributed-optimizer"),
    ],
)
def test_parallel_layout_matches_single_rank(converted, reference_run, world_size, layout, dp_size):
    hf_path, root = converted
    results = harness.run_ranks(world_size, harness.train_run, layout, hf_path, root, STEPS)
    expected = _losses(reference_run)
    for result in results:  # every rank reports the same global numbers
        assert _losses(result) == pytest.approx(expected, rel=1e-4, abs=1e-5)
        grad_norms = [step["grad_norm"] for step in result["history"]]
        assert grad_norms == pytest.approx(
            [s["grad_norm"] for s in reference_run["history"]], rel=1e-3
        )
    reporters = [r for r in results if r["place"][2]]
    assert {r["place"][1] for r in results} == {dp_size}
    assert sorted(r["place"][0] for r in reporters) == list(range(dp_size))  # one per DP rank
