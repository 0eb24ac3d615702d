"""GRPO/SFT math against NeMo RL's formulas, term by term (issue 15).

Each term has a reference implementation (tests/core/rl_math_reference.py, which writes out
the formulas), in plain Python floats (no hpcrl code), checked on hand-computable cases and
on random batches. Gradients are checked against the analytic derivatives written next to
each formula.
"""

from __future__ import annotations

import math
import random

import attrs
import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.config.recipe import LossFnCfg  # noqa: E402
from hpcrl.core.algorithms.advantages import group_advantages  # noqa: E402
from hpcrl.core.algorithms.losses import calculate_kl, grpo_loss, sft_loss  # noqa: E402
from tests.core.rl_math_reference import (  # noqa: E402
    BASE,
    CONFIGS,
    random_batch,
    ref_advantages,
    ref_kl,
    reference_loss,
)


# --------------------------------------------------------------------------- advantages
def test_leave_one_out_divides_by_the_leave_one_out_std() -> None:
    # Issue 15 case: rewards [1,0,0,0], leave-one-out, normalised. Member 0: others [0,0,0]
    # → baseline 0, std 0 → A = 1 unscaled. Others: baseline 1/3, std of [1,0,0] = √(1/3)
    # → (0 − 1/3)/√(1/3) = −0.57735. (hpcrl before: [2.0, −0.667×3], n/(n−1) × the mean form.)
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0]), 4, leave_one_out=True)
    assert adv.tolist() == pytest.approx([1.0, -0.57735, -0.57735, -0.57735], abs=1e-5)
    # mean baseline: mean 0.25, std 0.5 → [1.5, −0.5×3] (unchanged by the fix)
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0]), 4, leave_one_out=False)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)


def test_equal_groups_get_zero_and_tiny_std_divides() -> None:
    for loo in (False, True):
        adv = group_advantages(torch.full((8,), 0.7), 4, leave_one_out=loo)
        assert adv.abs().max().item() < 1e-6
    # 0 < std ≤ 1e-6: NeMo RL divides by (std + 1e-6) (hpcrl before: zeroed).
    # [0, 1e-7, 0, 0]: mean 2.5e-8, std 5e-8 → A_1 = 7.5e-8 / 1.05e-6 = 0.0714.
    adv = group_advantages(torch.tensor([0.0, 1e-7, 0.0, 0.0], dtype=torch.float64), 4)
    assert adv[1].item() == pytest.approx(7.5e-8 / (5e-8 + 1e-6), rel=1e-3)


def test_small_groups() -> None:
    assert group_advantages(torch.tensor([3.0, 1.0]), 1).tolist() == [0.0, 0.0]
    # n = 2, leave-one-out: one other member, std 0 → A = r − other, unscaled
    assert group_advantages(torch.tensor([3.0, 1.0]), 2, leave_one_out=True).tolist() == [2, -2]


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("loo", [True, False])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_random_advantages_match_the_reference(normalize, loo, n) -> None:
    rng = random.Random(n * 7 + loo * 3 + normalize)
    rewards = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(6 * n)]
    got = group_advantages(
        torch.tensor(rewards, dtype=torch.float64), n, normalize=normalize, leave_one_out=loo
    )
    assert got.tolist() == pytest.approx(ref_advantages(rewards, n, normalize, loo), abs=1e-5)


# --------------------------------------------------------------------------- batches
def run_loss(batch: dict, cfg: LossFnCfg, num_tokens: float | None = None):
    lp = batch["lp"].clone().requires_grad_(True)
    data = {k: v for k, v in batch.items() if k != "lp"}
    total = float(batch["token_mask"].sum()) if num_tokens is None else num_tokens
    loss, metrics = grpo_loss(lp, data, total, cfg=cfg)
    loss.backward()
    return loss.item(), lp.grad, metrics


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_batches_match_the_reference_in_value_and_gradient(name, seed) -> None:
    cfg = CONFIGS[name]
    batch = random_batch(seed)
    loss, grad, _ = run_loss(batch, cfg)
    want_loss, want_grad = reference_loss(batch, cfg)
    assert loss == pytest.approx(want_loss, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(
        grad, torch.tensor(want_grad, dtype=grad.dtype), rtol=1e-9, atol=1e-12
    )


def test_random_cases_exercise_every_branch() -> None:
    """The random batches above do hit clipping, dual clip, both clamps and truncation."""
    batch = random_batch(0)
    _, _, metrics = run_loss(batch, CONFIGS["dual_clip"])
    assert 0 < metrics["clip_fraction"] < 1
    _, _, metrics = run_loss(batch, CONFIGS["tis"])
    assert 0 < metrics["is_oob_ratio"] < 1
    ref = batch["ref_logprobs"].tolist()
    lp = batch["lp"].tolist()
    gaps = [abs(r - x) for rr, ll in zip(ref, lp, strict=True) for r, x in zip(rr, ll, strict=True)]
    assert max(gaps) > 1.0 and min(gaps) < 1.0  # k2_tight_clamps: both sides of the input clamp


# --------------------------------------------------------------------------- KL hand cases
def test_kl_is_clamped_issue_case() -> None:
    # logp = −30, ref = −0.5: log-ratio 29.5. Unclamped k3 = e^29.5 − 30.5 = 6.5e12, k2 = 435.1.
    lp, ref = torch.tensor([-30.0], dtype=torch.float64), torch.tensor([-0.5], dtype=torch.float64)
    assert calculate_kl(lp, ref, "k3").item() == pytest.approx(math.exp(29.5) - 30.5, rel=1e-12)
    assert calculate_kl(lp, ref, "k3").item() == pytest.approx(6.5e12, rel=0.01)
    assert calculate_kl(lp, ref, "k2").item() == pytest.approx(435.125)
    # NeMo RL's defaults: log-ratio clamped to 20 (k3 = e^20 − 21 = 4.85e8), then the value to 10.
    assert calculate_kl(lp, ref, "k3", 20.0, None).item() == pytest.approx(math.exp(20) - 21)
    for kind, bound in (("k1", -10.0), ("k2", 10.0), ("k3", 10.0)):  # k1 = lp − ref < 0
        assert calculate_kl(lp, ref, kind, 20.0, 10.0).item() == bound
    # In the loss, with the recipe defaults: per-token KL 10, no gradient through it.
    batch = {
        "lp": lp[None],
        "old_logprobs": lp[None],
        "generation_logprobs": lp[None],
        "ref_logprobs": ref[None],
        "advantages": torch.zeros(1, dtype=torch.float64),
        "token_mask": torch.ones(1, 1, dtype=torch.float64),
    }
    loss, grad, metrics = run_loss(batch, LossFnCfg(reference_policy_kl_penalty=0.01))
    assert metrics["kl"] == 10.0 and loss == pytest.approx(0.1)
    assert grad.abs().max().item() == 0.0


def test_kl_gradient_is_logp_minus_ref_issue_case() -> None:
    # lp − ref = [1, −1, 0, 2], A = 0, β = 1, 4 tokens: d loss/d lp = (lp − ref)/4.
    # hpcrl before (gradient of the k3 value itself, 1 − e^(ref−lp)): [0.632, −1.718, 0, 0.865].
    diff = torch.tensor([[1.0, -1.0, 0.0, 2.0]], dtype=torch.float64)
    batch = {
        "lp": diff - 3.0,
        "old_logprobs": diff - 3.0,
        "generation_logprobs": diff - 3.0,
        "ref_logprobs": torch.full((1, 4), -3.0, dtype=torch.float64),
        "advantages": torch.zeros(1, dtype=torch.float64),
        "token_mask": torch.ones(1, 4, dtype=torch.float64),
    }
    _, grad, _ = run_loss(batch, LossFnCfg(reference_policy_kl_penalty=1.0))
    assert (grad * 4).tolist()[0] == pytest.approx([1.0, -1.0, 0.0, 2.0], abs=1e-12)
    value_grad = [1 - math.exp(-d) for d in diff[0].tolist()]
    assert value_grad == pytest.approx([0.632, -1.718, 0.0, 0.865], abs=1e-3)


def test_on_policy_kl_weights_by_the_ratio_to_generation_with_its_gradient() -> None:
    # lp = −1, gen = −1 − ln 2 → W = 2; ref = −2 (r = −1): k3 = e^−1 − 1 + 1 = 0.3679.
    # value W·k3 = 0.7358; gradient W·(k3 + 1 − e^r) = W·(lp − ref) = 2.
    batch = {
        "lp": torch.tensor([[-1.0]], dtype=torch.float64),
        "old_logprobs": torch.tensor([[-1.0]], dtype=torch.float64),
        "generation_logprobs": torch.tensor([[-1.0 - math.log(2)]], dtype=torch.float64),
        "ref_logprobs": torch.tensor([[-2.0]], dtype=torch.float64),
        "advantages": torch.zeros(1, dtype=torch.float64),
        "token_mask": torch.ones(1, 1, dtype=torch.float64),
    }
    cfg = LossFnCfg(reference_policy_kl_penalty=1.0, use_on_policy_kl_approximation=True)
    loss, grad, _ = run_loss(batch, cfg)
    assert loss == pytest.approx(2 * math.exp(-1), rel=1e-12)
    assert grad.item() == pytest.approx(2.0, rel=1e-12)


# --------------------------------------------------------------------------- importance weights
def test_importance_weights_hand_cases() -> None:
    # old − gen = [ln 0.25, ln 0.5, 0, ln 3, +inf, NaN]; A = 1, ratio 1 → per-token loss −w;
    # 6 tokens. w = exp(old − gen) with NaN/±inf → 0: [0.25, 0.5, 1, 3, 0, ·]. Token 5's old
    # log-prob is NaN: like a −inf one (NeMo RL's mask_out_neg_inf_logprobs) it becomes 0, so
    # w = exp(0 − 0) = 1 and it stays in the loss (hpcrl before issue 24: left out).
    old = torch.tensor(
        [[math.log(0.25), math.log(0.5), 0.0, math.log(3.0), 0.0, float("nan")]],
        dtype=torch.float64,
    )
    gen = torch.tensor([[0.0, 0.0, 0.0, 0.0, float("-inf"), 0.0]], dtype=torch.float64)
    batch = {
        "lp": torch.nan_to_num(old, nan=0.0),
        "old_logprobs": old,
        "generation_logprobs": gen,
        "advantages": torch.ones(1, dtype=torch.float64),
        "token_mask": torch.ones(1, 6, dtype=torch.float64),
        "num_global_sequences": torch.ones(1, dtype=torch.float64),
    }
    # Sum of weights, share out of [0.4, 2]: none: 0.25+0.5+1+3+0+1; tis clamps 0.25→0.4,
    # 3→2, 0→0.4; icepop zeroes 0.25, 3 and 0. Out of bounds: 0.25, 3 and the zero = 3 of 6.
    cases = {
        None: (5.75, None),
        "tis": (0.4 + 0.5 + 1 + 2 + 0.4 + 1, 3 / 6),
        "icepop": (2.5, 3 / 6),
    }
    for kind, (weight_sum, oob) in cases.items():
        cfg = attrs.evolve(
            BASE,
            use_importance_sampling_correction=True,
            truncated_importance_sampling_type=kind,
            truncated_importance_sampling_ratio=2.0 if kind else None,
            truncated_importance_sampling_ratio_min=0.4 if kind else None,
        )
        loss, grad, metrics = run_loss(batch, cfg, num_tokens=6.0)
        assert loss == pytest.approx(-weight_sum / 6, rel=1e-12), kind
        assert torch.isfinite(grad).all()
        if oob is not None:
            assert metrics["is_oob_ratio"] == pytest.approx(oob), kind


def test_seq_mask_tis_drops_whole_sequences() -> None:
    # row 0: log w = [0.1, −0.1] → geometric mean 1 → kept, raw weights e^±0.1;
    # row 1: log w = [0.5, 0.5] → 1.65 > 1.2 → whole row weight 0. A = 1, ratio 1.
    old = torch.tensor([[0.1, -0.1], [0.5, 0.5]], dtype=torch.float64)
    batch = {
        "lp": old.clone(),
        "old_logprobs": old,
        "generation_logprobs": torch.zeros(2, 2, dtype=torch.float64),
        "advantages": torch.ones(2, dtype=torch.float64),
        "token_mask": torch.ones(2, 2, dtype=torch.float64),
        "num_global_sequences": torch.full((2,), 2.0, dtype=torch.float64),
    }
    cfg = attrs.evolve(
        BASE,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=1.2,
        truncated_importance_sampling_ratio_min=0.8,
    )
    loss, _, metrics = run_loss(batch, cfg)
    assert loss == pytest.approx(-(math.exp(0.1) + math.exp(-0.1)) / 4, rel=1e-12)
    assert metrics["is_oob_ratio"] == pytest.approx(0.5)


def test_filtered_tokens_are_zeroed_and_stay_in_the_loss() -> None:
    # NeMo RL's mask_out_neg_inf_logprobs: a token the trainer's top-k/top-p dropped has its
    # −inf log-prob replaced by 0 (no gradient) and stays in the mask. Token 1: lp 0, old −2 →
    # ratio e² → clipped branch −A·1.2 (a constant); the KL term uses the unfiltered log-probs.
    lp = torch.tensor([[-1.0, float("-inf")]], dtype=torch.float64)
    batch = {
        "lp": lp,
        "old_logprobs": torch.tensor([[-1.0, -2.0]], dtype=torch.float64),
        "generation_logprobs": torch.tensor([[-1.0, -2.0]], dtype=torch.float64),
        "ref_logprobs": torch.tensor([[-1.0, -3.0]], dtype=torch.float64),
        "curr_logprobs_unfiltered": torch.tensor([[-1.2, -2.5]], dtype=torch.float64),
        "advantages": torch.ones(1, dtype=torch.float64),
        "token_mask": torch.ones(1, 2, dtype=torch.float64),
    }
    loss, grad, _ = run_loss(batch, LossFnCfg(reference_policy_kl_penalty=0.5))
    k3 = [ref_kl(-1.2, -1.0, "k3", 20, 10)[0], ref_kl(-2.5, -3.0, "k3", 20, 10)[0]]
    # hpcrl before issue 24 left token 1 out of the numerator: (−1.0 + 0.5·Σk3) / 2
    assert loss == pytest.approx((-1.0 - 1.2 + 0.5 * sum(k3)) / 2, rel=1e-12)
    assert torch.isfinite(grad).all() and grad[0, 1].item() == 0.0


def test_sequence_level_denominators_count_filtered_tokens_issue_case() -> None:
    # Sequence-level loss, A = 1, ratio 1. Row 0: [−1 kept, −inf dropped by the trainer's
    # top-k/top-p in both passes]; row 1: [−2, −2]. NeMo RL divides row 0 by its 2 loss tokens
    # (the dropped one: 0 − 0, ratio 1, −A), so d loss / d lp[0, 0] = −1/(2 rows · 2 tokens) =
    # −0.25; hpcrl before divided row 0 by its 1 usable token: −0.5.
    inf = float("-inf")
    lp = torch.tensor([[-1.0, inf], [-2.0, -2.0]], dtype=torch.float64)
    batch = {
        "lp": lp,
        "old_logprobs": lp.clone(),
        "generation_logprobs": torch.tensor([[-1.0, -3.0], [-2.0, -2.0]], dtype=torch.float64),
        "advantages": torch.ones(2, dtype=torch.float64),
        "token_mask": torch.ones(2, 2, dtype=torch.float64),
        "num_global_sequences": torch.full((2,), 2.0, dtype=torch.float64),
    }
    loss, grad, _ = run_loss(batch, attrs.evolve(BASE, token_level_loss=False))
    assert loss == pytest.approx(-1.0, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([-0.25, 0.0, -0.25, -0.25], abs=1e-12)


@pytest.mark.parametrize("name", ["plain", "sequence_level", "everything", "seq_mask_tis"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_batches_with_filtered_tokens_match_nemo_rl(name, seed) -> None:
    """About a third of the current and old log-probs −inf (independently, as when the trainer's
    top-k/top-p drops a token in one pass and not in the other): the loss is the reference's on
    the batch with those log-probs 0 (NeMo RL), and no gradient reaches the dropped tokens."""
    cfg = CONFIGS[name]
    batch = random_batch(seed)
    g = torch.Generator().manual_seed(100 + seed)
    inf = float("-inf")
    dropped = torch.rand(batch["lp"].shape, generator=g) < 0.3
    old_dropped = torch.rand(batch["lp"].shape, generator=g) < 0.3
    filtered = dict(batch, lp=batch["lp"].masked_fill(dropped, inf))
    filtered["old_logprobs"] = batch["old_logprobs"].masked_fill(old_dropped, inf)
    zeroed = dict(batch, lp=batch["lp"].masked_fill(dropped, 0.0))
    zeroed["old_logprobs"] = batch["old_logprobs"].masked_fill(old_dropped, 0.0)
    # The KL term reads the unfiltered log-probs (tested above); here the PG term alone.
    cfg = attrs.evolve(cfg, reference_policy_kl_penalty=0.0)
    loss, grad, _ = run_loss(filtered, cfg)
    want_loss, want_grad = reference_loss(zeroed, cfg)
    assert loss == pytest.approx(want_loss, rel=1e-9, abs=1e-12)
    want = torch.tensor(want_grad, dtype=grad.dtype).masked_fill(dropped, 0.0)
    torch.testing.assert_close(grad, want, rtol=1e-9, atol=1e-12)
    assert (dropped & (batch["token_mask"] > 0)).any()


# --------------------------------------------------------------------------- normalisation
def _model_logprobs(weight, features, targets):
    return torch.log_softmax(features @ weight, dim=-1).gather(-1, targets[..., None])[..., 0]


@pytest.mark.parametrize("name", ["plain", "sequence_level", "everything", "seq_mask_tis"])
@pytest.mark.parametrize("backend", ["automodel", "megatron"])
def test_uneven_micro_batches_times_dp_ranks_give_the_full_batch_gradient(name, backend) -> None:
    """4 DP ranks × micro-batches of 2 rows (3 rows per rank: [2, 1]); each backend's loss
    scaling (Automodel: loss·DP then FSDP's mean over ranks; Megatron: loss·micro·DP, the
    schedule's 1/micro, DDP's 1/DP) against one full-batch backward, in float64."""
    cfg = CONFIGS[name]
    g = torch.Generator().manual_seed(5)
    rows, width, vocab, hidden, dp, micro = 12, 6, 11, 5, 4, 2
    features = torch.randn(rows, width, hidden, generator=g, dtype=torch.float64)
    targets = torch.randint(0, vocab, (rows, width), generator=g)
    weight = torch.randn(hidden, vocab, generator=g, dtype=torch.float64, requires_grad=True)
    batch = {k: v for k, v in random_batch(9, rows, width).items() if k != "lp"}
    num_tokens = float(batch["token_mask"].sum())

    def grad_of(rows_slice, scale):
        part = {k: v[rows_slice] for k, v in batch.items()}
        lp = _model_logprobs(weight, features[rows_slice], targets[rows_slice])
        loss, _ = grpo_loss(lp, part, num_tokens, cfg=cfg)
        return torch.autograd.grad(loss * scale, weight)[0]

    full = grad_of(slice(0, rows), 1.0)
    per_rank = rows // dp
    rank_grads = []
    for rank in range(dp):
        starts = range(rank * per_rank, (rank + 1) * per_rank, micro)
        slices = [slice(s, min(s + micro, (rank + 1) * per_rank)) for s in starts]
        if backend == "automodel":
            rank_grads.append(sum(grad_of(s, dp) for s in slices))
        else:
            rank_grads.append(sum(grad_of(s, len(slices) * dp) / len(slices) for s in slices))
    combined = sum(rank_grads) / dp
    relative = ((combined - full).norm() / full.norm()).item()
    assert relative < 1e-13


def test_sft_loss_is_the_masked_token_mean_and_splits_exactly() -> None:
    batch = random_batch(3)
    lp, mask = batch["lp"], batch["token_mask"]
    n = float(mask.sum())
    want = (
        -sum(
            x * m
            for rr, mm in zip(lp.tolist(), mask.tolist(), strict=True)
            for x, m in zip(rr, mm, strict=True)
        )
        / n
    )
    loss, metrics = sft_loss(lp, {"token_mask": mask}, n)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    parts = sum(sft_loss(lp[i : i + 4], {"token_mask": mask[i : i + 4]}, n)[0] for i in (0, 4))
    assert parts.item() == pytest.approx(want, rel=1e-12)
    assert metrics["num_tokens"] == n


# --------------------------------------------------------------------------- overlong filtering
def _generation(rows: list[list[int]], prompt_len: int = 2):
    """GenerationOutput-like rows: prompt [7, 7] then the given response tokens."""
    import types

    width = prompt_len + max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    response_mask = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        ids[i, :prompt_len] = 7
        ids[i, prompt_len : prompt_len + len(row)] = torch.tensor(row)
        response_mask[i, prompt_len : prompt_len + len(row)] = 1
    return types.SimpleNamespace(
        input_ids=ids,
        attention_mask=(ids != 0).long() | (response_mask > 0).long(),
        response_mask=response_mask,
        generation_logprobs=-response_mask,
        prompt_lengths=torch.full((len(rows),), prompt_len),
        response_lengths=torch.tensor([len(r) for r in rows]),
    )


def test_truncated_means_cut_off_by_max_new_tokens() -> None:
    from hpcrl.config.recipe import GenerationCfg
    from hpcrl.core.algorithms.grpo import truncated_responses

    cfg = GenerationCfg(max_new_tokens=3, stop_token_ids=(9,), stop_strings=("!",))
    eos = 2
    rows = [[5, 5, 5], [5, 5, 2], [5, 2], [5, 5, 9], [5, 5, 6]]
    texts = ["aaa", "aa", "a", "aa", "a!b"]  # the last one hit a stop string
    flags = truncated_responses(_generation(rows), cfg, eos, texts)
    assert flags.tolist() == [True, False, False, False, False]


def test_overlong_filtering_masks_truncated_samples_after_the_baseline() -> None:
    from hpcrl.config.recipe import DataCfg, GrpoCfg, PolicyCfg, Recipe
    from hpcrl.core.algorithms.grpo import (
        Rollouts,
        build_train_batch,
        finish_train_batch,
        global_batch_chunks,
    )

    generation = _generation([[5, 5, 5], [5, 2], [5, 5, 5], [6, 2]])
    truncated = torch.tensor([True, False, True, False])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    rollouts = Rollouts(
        prompts=["p", "p", "q", "q"],
        answers=[""] * 4,
        responses=[""] * 4,
        rewards=rewards,
        unshaped_rewards=rewards,
        generation=generation,
        truncated=truncated,
        loss_multiplier=torch.ones(4),
        prompt_keys=[(7, 1), (7, 1), (7, 2), (7, 2)],
    )
    for flag in (False, True):
        recipe = Recipe(
            policy=PolicyCfg(model_name="m", train_global_batch_size=2),
            data=DataCfg(train_path="x"),
            grpo=GrpoCfg(num_generations_per_prompt=2, overlong_filtering=flag),
        )
        batch = build_train_batch(recipe, rollouts)
        batch["old_logprobs"] = batch["generation_logprobs"].clone()
        finish_train_batch(recipe, rollouts, batch)
        # advantages from all four rewards (groups [1, 0] and [0, 1]), as NeMo RL does
        assert batch["advantages"].tolist() == [1.0, -1.0, -1.0, 1.0]
        kept = [0.0, 1.0, 0.0, 1.0] if flag else [1.0] * 4
        assert batch["sample_mask"].tolist() == kept
        assert batch["token_mask"].sum(dim=1).tolist() == [
            n * k for n, k in zip([3, 2, 3, 2], kept, strict=True)
        ]
        counts = [c["num_global_sequences"][0].item() for c in global_batch_chunks(batch, 2)]
        assert counts == ([1.0, 1.0] if flag else [2.0, 2.0])
