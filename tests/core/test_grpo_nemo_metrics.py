"""The loss's diagnostic metrics and sequence-level log-prob error masking against NeMo RL
(issue 24, item 6), with tests/core/nemo_rl_reference.py as the reference, and how extrema
combine over micro-batches and optimizer steps (hpcrl.core.metric_reduction)."""

from __future__ import annotations

import math

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.config.recipe import LossFnCfg  # noqa: E402
from hpcrl.core.algorithms.losses import grpo_loss  # noqa: E402
from hpcrl.core.algorithms.sequence_masking import mask_by_sequence_logprob_error  # noqa: E402
from hpcrl.core.metric_reduction import accumulate, combine_optimizer_steps  # noqa: E402
from tests.core import nemo_rl_reference as ref  # noqa: E402
from tests.core.rl_math_reference import random_batch  # noqa: E402

METRICS = (
    "token_mult_prob_error",
    "gen_kl_error",
    "policy_kl_error",
    "js_divergence_error",
    "approx_entropy",
    "probs_ratio",
    "probs_ratio_clamped",
    "probs_ratio_min",
    "probs_ratio_max",
    "probs_ratio_clamped_min",
    "probs_ratio_clamped_max",
)


def filtered_batch(seed: int) -> dict:
    """A random batch whose current and old log-probs have a few −inf (top-k/top-p drops)."""
    batch = random_batch(seed, rows=8)
    g = torch.Generator().manual_seed(seed)
    batch["lp"] = batch["lp"].masked_fill(torch.rand(8, 7, generator=g) < 0.1, float("-inf"))
    old = batch["old_logprobs"]
    batch["old_logprobs"] = old.masked_fill(torch.rand(8, 7, generator=g) < 0.1, float("-inf"))
    return batch


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_metrics_match_nemo_rl_over_micro_batches(kl_type, seed) -> None:
    """Micro-batches of 3, 3 and 2 rows, each normalised by the global token count, combined
    the way the backends combine them: equal to NeMo RL's formulas over the whole batch."""
    batch = filtered_batch(seed)
    cfg = LossFnCfg(reference_policy_kl_penalty=0.0, reference_policy_kl_type=kl_type)
    mask = batch["token_mask"]
    total = float(mask.sum())
    totals: dict = {}
    for rows in (slice(0, 3), slice(3, 6), slice(6, 8)):
        part = {k: v[rows] for k, v in batch.items() if k != "lp"}
        _, metrics = grpo_loss(batch["lp"][rows], part, total, cfg=cfg)
        for name, value in metrics.items():
            accumulate(totals, name, value)
    (got,) = [combine_optimizer_steps([{k: float(v) for k, v in totals.items()}])]

    def zeroed(values):
        return torch.nan_to_num(values, neginf=0.0).tolist()

    want = ref.loss_metrics(
        zeroed(batch["lp"]),
        zeroed(batch["old_logprobs"]),
        batch["generation_logprobs"].tolist(),
        mask.tolist(),
        kl_type,
        cfg.ratio_clip_min,
        cfg.ratio_clip_max,
    )
    for name in METRICS:
        assert got[name] == pytest.approx(want[name], rel=1e-9), name
    assert got["probs_ratio_min"] < got["probs_ratio"] < got["probs_ratio_max"]
    assert got["ratio_mean"] == pytest.approx(got["probs_ratio"], rel=1e-12)


def test_extrema_combine_with_min_and_max_and_say_minus_one_without_tokens() -> None:
    totals: dict = {}
    for value in (3.0, torch.tensor(1.5), 2.0):
        accumulate(totals, "probs_ratio_min", value)
        accumulate(totals, "probs_ratio_max", value)
        accumulate(totals, "probs_ratio", value)
    assert (float(totals["probs_ratio_min"]), float(totals["probs_ratio_max"])) == (1.5, 3.0)
    assert float(totals["probs_ratio"]) == 6.5
    steps = [
        {"probs_ratio_min": 0.9, "probs_ratio_max": 1.1, "loss": 1.0},
        {"probs_ratio_min": math.inf, "probs_ratio_max": -math.inf, "loss": 3.0},
    ]
    assert combine_optimizer_steps(steps) == {
        "probs_ratio_min": 0.9,
        "probs_ratio_max": 1.1,
        "loss": 2.0,
    }
    empty = [{"probs_ratio_min": math.inf, "probs_ratio_max": -math.inf}]
    assert combine_optimizer_steps(empty) == {"probs_ratio_min": -1.0, "probs_ratio_max": -1.0}


def test_micro_batch_without_loss_tokens_gives_the_sentinels() -> None:
    batch = random_batch(4, rows=2)
    batch["token_mask"] = torch.zeros_like(batch["token_mask"])
    part = {k: v for k, v in batch.items() if k != "lp"}
    _, metrics = grpo_loss(batch["lp"], part, 1.0, cfg=LossFnCfg(reference_policy_kl_penalty=0))
    assert (metrics["probs_ratio_min"].item(), metrics["probs_ratio_max"].item()) == (
        math.inf,
        -math.inf,
    )
    means = {k: v.item() for k, v in metrics.items() if not k.endswith(("_min", "_max"))}
    assert means and all(value == 0.0 for value in means.values()), means


# --------------------------------------------------------------------------- sequence errors
def error_batch() -> dict:
    """Four sequences; sampler and trainer log-probs differ by [0], [0.1, 0.3], [0.8], [0.5]
    (row 3's last token is −inf in the trainer's pass: 0, as in the loss); row 2 carries
    sample mask 0 (a prompt that did not fit), so it counts nowhere."""
    inf = float("-inf")
    old = torch.tensor([[0.0, -1.0, -1.0], [0.0, -1.0, -2.0], [0.0, -1.0, 0.0], [0.0, -1.0, inf]])
    generation = torch.tensor(
        [[0.0, -1.0, -1.0], [0.0, -1.1, -1.7], [0.0, -0.2, 0.0], [0.0, -1.5, -0.5]]
    )
    sample_mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    token_mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    return {
        "old_logprobs": old,
        "generation_logprobs": generation,
        "sample_mask": sample_mask,
        "token_mask": token_mask * sample_mask[:, None],
    }


def test_sequence_errors_are_always_recorded_and_a_threshold_masks() -> None:
    batch = error_batch()
    want = ref.seq_mult_prob_errors(
        batch["generation_logprobs"].tolist(),
        torch.nan_to_num(batch["old_logprobs"], neginf=0.0).tolist(),
        batch["token_mask"].tolist(),
    )
    # row 0: 1; row 1: (e^0.1 + e^0.3)/2 = 1.22752; row 2: none; row 3: (e^0.5 + e^0.5)/2
    assert want[0] == 1.0 and want[2] is None
    assert want[1] == pytest.approx(1.22752, abs=1e-5) and want[3] == pytest.approx(1.64872, 1e-5)
    valid = [w for w in want if w is not None]
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    metrics = mask_by_sequence_logprob_error(batch, rewards, None)
    assert metrics["max_seq_mult_prob_error"] == pytest.approx(max(valid), rel=1e-6)
    assert metrics["mean_seq_mult_prob_error"] == pytest.approx(sum(valid) / 3, rel=1e-6)
    assert metrics["min_seq_mult_prob_error"] == pytest.approx(min(valid), rel=1e-6)
    assert metrics["num_masked_seqs_by_logprob_error"] == 0
    assert batch["sample_mask"].tolist() == [1.0, 1.0, 0.0, 1.0]
    # threshold 1.5: row 3 (error 1.65, reward 1) leaves the loss
    metrics = mask_by_sequence_logprob_error(batch, rewards, 1.5)
    assert batch["sample_mask"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert batch["token_mask"].sum(dim=1).tolist() == [2.0, 2.0, 0.0, 0.0]
    assert metrics["num_masked_seqs_by_logprob_error"] == 1
    assert metrics["masked_correct_pct"] == 1.0
    assert metrics["max_seq_mult_prob_error_after_mask"] == pytest.approx(want[1], rel=1e-6)
    assert metrics["min_seq_mult_prob_error_after_mask"] == 1.0
    assert metrics["max_seq_mult_prob_error"] == pytest.approx(want[3], rel=1e-6)
