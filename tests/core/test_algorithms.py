"""Losses and advantages on small hand-computed cases (numbers worked out in the comments)."""

from __future__ import annotations

import functools
import math
import pickle

import attrs
import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.config.recipe import LossFnCfg  # noqa: E402
from hpcrl.core.algorithms.advantages import group_advantages  # noqa: E402
from hpcrl.core.algorithms.losses import calculate_kl, grpo_loss, sft_loss  # noqa: E402

NO_KL = LossFnCfg(reference_policy_kl_penalty=0.0)


def _batch(logprob_rows, old_rows, advantages, mask_rows, **extra):
    batch = {
        "old_logprobs": torch.tensor(old_rows),
        "generation_logprobs": torch.tensor(old_rows),  # sampled by the old policy
        "advantages": torch.tensor(advantages),
        "token_mask": torch.tensor(mask_rows),
    }
    batch.update({k: torch.tensor(v) for k, v in extra.items()})
    return torch.tensor(logprob_rows, requires_grad=True), batch


def test_ratio_clipping_at_known_values() -> None:
    # old = 0 everywhere; ratios exp(lp): 1.5, 0.5 (row A=+1) and 1.5, 0.5 (row A=-1).
    # A=+1: ratio 1.5 -> min(1.5, clip 1.2) = 1.2 → loss −1.2 (clipped);
    #       ratio 0.5 -> min(0.5, 0.8) = 0.5 → loss −0.5.
    # A=−1: ratio 1.5 -> max(1.5, 1.2)·… loss = max(1.5, 1.2) = 1.5 (unclipped);
    #       ratio 0.5 -> loss = max(0.5, 0.8) = 0.8 (clipped).
    # masked mean over 4 tokens: (−1.2 − 0.5 + 1.5 + 0.8) / 4 = 0.15
    ln15, ln05 = math.log(1.5), math.log(0.5)
    logprobs, batch = _batch(
        [[0.0, ln15, ln05], [0.0, ln15, ln05]],
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
        [1.0, -1.0],
        [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]],
    )
    cfg = LossFnCfg(ratio_clip_min=0.2, ratio_clip_max=0.2, reference_policy_kl_penalty=0.0)
    loss, metrics = grpo_loss(logprobs, batch, 4.0, cfg=cfg)
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    # gradient flows only through unclipped tokens: d(−A·r)/dlp = −A·r
    expected = torch.tensor([[0.0, 0.0, -0.5], [0.0, 1.5, 0.0]]) / 4
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    # A = −1, ratio 5: standard clipped loss = max(5, 1.2) = 5; dual clip c=3 → min(5, 3) = 3.
    logprobs, batch = _batch([[math.log(5.0)]], [[0.0]], [-1.0], [[1.0]])
    loss, _ = grpo_loss(logprobs, batch, 1.0, cfg=attrs.evolve(NO_KL, ratio_clip_c=3.0))
    assert loss.item() == pytest.approx(3.0, abs=1e-6)
    logprobs, batch = _batch([[math.log(5.0)]], [[0.0]], [-1.0], [[1.0]])
    loss, _ = grpo_loss(logprobs, batch, 1.0, cfg=NO_KL)
    assert loss.item() == pytest.approx(5.0, abs=1e-6)


def _nemo_rl_cispo_token_loss(lp, old, advantages, clip_low, clip_high):
    """NeMo RL's ClippedPGLossFn with use_cispo (7ea279a), token level:
    −A · (clamp(exp(lp − old), 1 − low, 1 + high)).detach() · lp."""
    ratio = (lp - old).exp().clamp(1.0 - clip_low, 1.0 + clip_high)
    return -advantages[:, None] * ratio.detach() * lp


def test_cispo_keeps_the_gradient_of_clipped_tokens() -> None:
    # old = 0; ratios 1.5 and 0.5 clamp to 1.2 and 0.8 (ε 0.2). Loss −A·w·lp summed over
    # the 4 tokens: −1.2·ln1.5 − 0.8·ln0.5 + 1.2·ln1.5 + 0.8·ln0.5 = 0. The gradient −A·w
    # reaches every token, the two PPO's clip cuts off (test_ratio_clipping_at_known_values).
    ln15, ln05 = math.log(1.5), math.log(0.5)
    rows = ([[0.0, ln15, ln05], [0.0, ln15, ln05]], [[0.0] * 3] * 2, [1.0, -1.0])
    mask = [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
    logprobs, batch = _batch(*rows, mask)
    cfg = LossFnCfg(reference_policy_kl_penalty=0.0, use_cispo=True)
    loss, metrics = grpo_loss(logprobs, batch, 4.0, cfg=cfg)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(1.0)
    expected = torch.tensor([[0.0, -1.2, -0.8], [0.0, 1.2, 0.8]]) / 4
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)
    reference_lp = torch.tensor(rows[0], requires_grad=True)
    reference = _nemo_rl_cispo_token_loss(
        reference_lp, torch.tensor(rows[1]), torch.tensor(rows[2]), 0.2, 0.2
    )
    (reference * torch.tensor(mask)).sum().div(4.0).backward()
    assert torch.allclose(logprobs.grad, reference_lp.grad, atol=1e-6)
    ppo_lp, ppo_batch = _batch(*rows, mask)
    grpo_loss(ppo_lp, ppo_batch, 4.0, cfg=NO_KL)[0].backward()
    assert not torch.allclose(ppo_lp.grad, logprobs.grad)


def test_kl_estimators_match_their_formulas() -> None:
    logprobs = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    # log_ratio = ref − lp = [−0.5, 1.0]
    assert torch.allclose(calculate_kl(logprobs, ref, "k1"), torch.tensor([0.5, -1.0]))
    assert torch.allclose(calculate_kl(logprobs, ref, "k2"), torch.tensor([0.125, 0.5]))
    k3 = torch.tensor([math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1.0])
    assert torch.allclose(calculate_kl(logprobs, ref, "k3"), k3)


def test_kl_penalty_adds_beta_times_mean_kl_and_masks_prompt_tokens() -> None:
    # ratio 1 everywhere (lp = old), A = 0 → pg loss 0; only the KL term remains.
    # tokens counted: lp=-1/ref=-1.5 (k3 = e^-0.5 − 0.5) and lp=-2/ref=-1 (k3 = e − 2);
    # the prompt token (mask 0) has a huge KL that must not count.
    logprobs, batch = _batch(
        [[-1.0, -1.0, -2.0]],
        [[-1.0, -1.0, -2.0]],
        [0.0],
        [[0.0, 1.0, 1.0]],
        ref_logprobs=[[-50.0, -1.5, -1.0]],
    )
    cfg = LossFnCfg(reference_policy_kl_penalty=0.1, reference_policy_kl_type="k3")
    loss, metrics = grpo_loss(logprobs, batch, 2.0, cfg=cfg)
    mean_kl = ((math.exp(-0.5) - 0.5) + (math.e - 2.0)) / 2
    assert metrics["kl"] == pytest.approx(mean_kl, rel=1e-5)
    assert loss.item() == pytest.approx(0.1 * mean_kl, rel=1e-5)


def test_micro_batch_shares_sum_to_the_full_batch_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(6, 5, generator=gen)
    batch = {
        "old_logprobs": logprobs + 0.3 * torch.randn(6, 5, generator=gen),
        "generation_logprobs": logprobs - 0.2,
        "advantages": torch.randn(6, generator=gen),
        "token_mask": (torch.rand(6, 5, generator=gen) > 0.3).float(),
        "ref_logprobs": logprobs - 0.1,
    }
    cfg = LossFnCfg(reference_policy_kl_penalty=0.05)
    total = float(batch["token_mask"].sum())
    full, _ = grpo_loss(logprobs, batch, total, cfg=cfg)
    parts = sum(
        grpo_loss(logprobs[i : i + 2], {k: v[i : i + 2] for k, v in batch.items()}, total, cfg=cfg)[
            0
        ]
        for i in range(0, 6, 2)
    )
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_importance_sampling_correction_weights_by_old_over_generation_probs() -> None:
    # A = 1, lp = old = 0 (ratio 1, loss −1 per token); generation logprob −ln 2 → weight 2.
    logprobs, batch = _batch(
        [[0.0]], [[0.0]], [1.0], [[1.0]], generation_logprobs=[[-math.log(2.0)]]
    )
    cfg = attrs.evolve(NO_KL, use_importance_sampling_correction=True)
    loss, _ = grpo_loss(logprobs, batch, 1.0, cfg=cfg)
    assert loss.item() == pytest.approx(-2.0, rel=1e-6)


def test_sequence_level_normalisation_averages_rows_first() -> None:
    # A=+1, ratio 1 → per-token loss −1 on row 0 (3 tokens) and, A=−1, +1 on row 1 (1 token).
    # token level: (−3 + 1) / 4 = −0.5; sequence level: (−1 + 1) / 2 = 0.
    logprobs, batch = _batch(
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
        [[0.0] * 3] * 2,
        [1.0, -1.0],
        [[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]],
        num_global_sequences=[2.0, 2.0],
    )
    token, _ = grpo_loss(logprobs, batch, 4.0, cfg=NO_KL)
    sequence, _ = grpo_loss(logprobs, batch, 4.0, cfg=attrs.evolve(NO_KL, token_level_loss=False))
    assert token.item() == pytest.approx(-0.5)
    assert sequence.item() == pytest.approx(0.0, abs=1e-7)


def _nemo_rl_gspo_loss(lp, old, advantages, mask, clip):
    """NeMo RL's ClippedPGLossFn with sequence_level_importance_ratios (7ea279a): the ratio
    exp(masked_mean(lp − old)) repeated over the row's tokens, PPO's max of the two
    branches, then the sequence-level mean (per row, then over rows)."""
    seq = ((lp - old) * mask).sum(-1, keepdim=True) / (mask.sum(-1, keepdim=True) + 1e-8)
    ratio = seq.exp().repeat(1, lp.shape[1])
    a = advantages[:, None]
    loss = torch.max(-a * ratio, -a * ratio.clamp(1.0 - clip, 1.0 + clip))
    return ((loss * mask).sum(-1) / mask.sum(-1)).mean()


def test_gspo_ratio_is_the_sequence_mean_and_its_gradient_spreads() -> None:
    # log-ratios 0 and ln2 on each row's two tokens: GSPO's ratio is exp(ln2 / 2) = √2 for
    # every token (token level: 2 and 1). Row 0 (A = +1): max(−√2, −1.2) = −1.2, clipped, no
    # gradient; row 1 (A = −1): max(√2, 1.2) = √2. Loss (−1.2 + √2) / 2; row 1's gradient
    # r/4 on each token (d exp(mean)/d lp_t = r/2, halved by the two-row mean).
    ln2, root2 = math.log(2.0), math.sqrt(2.0)
    rows = ([[0.0, ln2, 0.0], [0.0, ln2, 0.0]], [[0.0] * 3] * 2, [1.0, -1.0])
    mask = [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
    cfg = attrs.evolve(NO_KL, sequence_level_importance_ratios=True, token_level_loss=False)
    logprobs, batch = _batch(*rows, mask, num_global_sequences=[2.0, 2.0])
    loss, metrics = grpo_loss(logprobs, batch, 4.0, cfg=cfg)
    loss.backward()
    assert loss.item() == pytest.approx((-1.2 + root2) / 2, abs=1e-6)
    expected = torch.tensor([[0.0, 0.0, 0.0], [0.0, root2 / 4, root2 / 4]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.5)  # row 0's two tokens of four
    reference_lp = torch.tensor(rows[0], requires_grad=True)
    reference = _nemo_rl_gspo_loss(
        reference_lp, torch.tensor(rows[1]), torch.tensor(rows[2]), torch.tensor(mask), 0.2
    )
    reference.backward()
    assert reference.item() == pytest.approx(loss.item(), abs=1e-6)
    assert torch.allclose(logprobs.grad, reference_lp.grad, atol=1e-6)
    token_lp, token_batch = _batch(*rows, mask, num_global_sequences=[2.0, 2.0])
    token_level = attrs.evolve(cfg, sequence_level_importance_ratios=False)
    assert grpo_loss(token_lp, token_batch, 4.0, cfg=token_level)[0].item() != pytest.approx(
        loss.item()
    )


def test_sft_loss_is_masked_mean_negative_logprob_and_picklable() -> None:
    logprobs = torch.tensor([[-9.0, -1.0, -3.0]])
    batch = {"token_mask": torch.tensor([[0.0, 1.0, 1.0]])}
    loss, metrics = sft_loss(logprobs, batch, 2.0)
    assert loss.item() == pytest.approx(2.0)
    assert metrics["num_tokens"] == 2.0
    restored = pickle.loads(pickle.dumps(functools.partial(grpo_loss, cfg=LossFnCfg())))
    assert restored.keywords["cfg"] == LossFnCfg()


def test_group_normalised_advantages() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    # group 1: mean 0.5, sample std sqrt(1/3) → ±0.5/0.57735 = ±0.866; group 2: constant → 0
    adv = group_advantages(rewards, 4)
    s = 0.5 / math.sqrt(1 / 3)
    assert torch.allclose(adv, torch.tensor([s, -s, -s, s, 0, 0, 0, 0]), atol=1e-4)
    raw = group_advantages(rewards, 4, normalize=False)
    assert torch.allclose(raw, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))


def test_leave_one_out_baseline() -> None:
    rewards = torch.tensor([3.0, 0.0, 0.0])
    # baselines: mean of others = 0, 1.5, 1.5 → advantages 3, −1.5, −1.5
    adv = group_advantages(rewards, 3, normalize=False, leave_one_out=True)
    assert torch.allclose(adv, torch.tensor([3.0, -1.5, -1.5]))
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(rewards, 4)


def test_on_policy_kl_approximation_weights_kl_by_current_over_generation_ratio() -> None:
    # A = 0 → only KL. lp = 0, generation = −ln 2 → weight exp(0 + ln 2) = 2 (NeMo RL: the
    # ratio to the sampler's log-probs, so stale async samples are reweighted); old is not
    # used. ref = −1: k1 = lp − ref = 1 → weighted 2; beta 0.5 → loss 1.0.
    logprobs, batch = _batch(
        [[0.0]],
        [[-5.0]],
        [0.0],
        [[1.0]],
        ref_logprobs=[[-1.0]],
        generation_logprobs=[[-math.log(2.0)]],
    )
    cfg = LossFnCfg(
        reference_policy_kl_penalty=0.5,
        reference_policy_kl_type="k1",
        use_on_policy_kl_approximation=True,
    )
    loss, metrics = grpo_loss(logprobs, batch, 1.0, cfg=cfg)
    assert loss.item() == pytest.approx(1.0, rel=1e-6)
    assert metrics["kl"] == pytest.approx(2.0, rel=1e-6)
