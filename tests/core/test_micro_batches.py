"""Micro-batching (NeMo RL's sequence packing and dynamic batching): the plans respect their
budgets and cover every row once, and the Automodel forward over packed or dynamic
micro-batches gives the unpacked path's losses and gradients.

Tolerance stated: float32 tiny Qwen2, GRPO loss summed over micro-batches — packed,
dynamic and full-width fixed (NeMo RL's) losses equal those of fixed micro-batches cut to
their own width (hpcrl's default) to 1e-6 relative, gradients to 1e-5 (max abs, over every
parameter). Different summation orders (attention over a longer row, other
micro-batch sums) are the only difference.
"""

from __future__ import annotations

import functools
import random

import attrs
import pytest
import torch

from hpcrl.config.recipe import LossFnCfg
from hpcrl.core.algorithms.losses import grpo_loss
from hpcrl.core.workers.micro_batches import (
    BatchingSettings,
    balanced_order,
    materialize,
    pack_bins,
    plan_shards,
    row_extents,
    row_lengths,
)

ALGORITHMS = [
    "modified_first_fit_decreasing",
    "first_fit_decreasing",
    "first_fit_shuffle",
    "concatenative",
]


def grpo_shaped_lengths(count: int, seed: int, longest: int = 128) -> list[int]:
    """Prompt 8–24 tokens + response 1..(longest − prompt): mixed, long-tailed lengths."""
    rng = random.Random(seed)
    return [
        min(longest, rng.randint(8, 24) + int(rng.expovariate(1 / 30)) + 1) for _ in range(count)
    ]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bins_hold_every_item_once_within_capacity(algorithm):
    sizes = grpo_shaped_lengths(200, seed=1)
    bins = pack_bins(sizes, 256, algorithm, seed=3)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(sizes[i] for i in b) <= 256 for b in bins)
    assert len(bins) <= 1.25 * sum(sizes) / 256 + 1  # close to the lower bound


def test_decreasing_algorithms_beat_plain_concatenation():
    sizes = grpo_shaped_lengths(300, seed=5)
    count = {a: len(pack_bins(sizes, 256, a)) for a in ALGORITHMS}
    assert count["modified_first_fit_decreasing"] <= count["concatenative"]
    assert count["first_fit_decreasing"] <= count["concatenative"]


@pytest.mark.parametrize("mode", ["dynamic", "packed"])
def test_plans_cover_rows_within_budget_equally_many_per_shard(mode):
    lengths = [grpo_shaped_lengths(16, seed=s) for s in range(4)]
    settings = BatchingSettings(mode=mode, tokens_per_micro_batch=160, round_to=16, divisible_by=4)
    plans = plan_shards(lengths, 128, settings)
    assert len({len(plan) for plan in plans}) == 1
    for shard_lengths, plan in zip(lengths, plans, strict=True):
        assert sorted(r for spec in plan for r in spec.rows) == list(range(16))
        for spec in plan:
            if mode == "dynamic":
                assert spec.width % 16 == 0 and spec.width % 4 == 0
                assert spec.tokens <= 160
                assert spec.width >= max(shard_lengths[r] for r in spec.rows)
            else:
                assert all(p % 4 == 0 for p in spec.pack_lengths)
                assert sum(spec.pack_lengths) <= 160 and spec.pack_width % 16 == 0


def test_packing_cuts_padded_tokens_on_grpo_shaped_rows():
    lengths = grpo_shaped_lengths(64, seed=9)
    fixed = plan_shards([lengths], 128, BatchingSettings(rows_per_micro_batch=4))[0]
    packed = plan_shards(
        [lengths], 128, BatchingSettings(mode="packed", tokens_per_micro_batch=512)
    )[0]
    assert sum(s.tokens for s in packed) < 0.6 * sum(s.tokens for s in fixed)


def test_fixed_micro_batches_are_cut_to_their_own_last_real_column():
    lengths = [5, 9, 3, 4, 12, 2, 7]
    settings = BatchingSettings(rows_per_micro_batch=2, divisible_by=4)
    plan = plan_shards([lengths], 16, settings)[0]
    assert [(spec.rows, spec.width) for spec in plan] == [
        ((0, 1), 12), ((2, 3), 4), ((4, 5), 12), ((6,), 8)
    ]  # fmt: skip
    # pipeline parallelism exchanges fixed-shape buffers: the batch's width everywhere
    same = plan_shards([lengths], 16, attrs.evolve(settings, same_width=True))[0]
    assert {spec.width for spec in same} == {16}


def test_a_whole_shard_micro_batch_is_the_shard_itself_and_others_are_cut():
    """A plan of one micro-batch holding every row at full width hands the shard's tensors
    on uncopied (a step's first kernel waits for the host's copies); any other spec cuts."""
    from hpcrl.core.workers.micro_batches import MicroBatchSpec
    from hpcrl.core.workers.sharding import pad_sequence_dim

    batch = grpo_batch([5, 9, 3, 16], 16, seed=1)
    whole = materialize(batch, MicroBatchSpec(rows=(0, 1, 2, 3), width=16))
    assert whole.keys() == batch.keys()
    assert all(whole[key] is batch[key] for key in batch)
    assert all(value is whole[key] for key, value in pad_sequence_dim(whole, 8).items())
    strided = {**batch, "input_ids": batch["input_ids"].t().contiguous().t()}
    assert not strided["input_ids"].is_contiguous()  # cut: a copy downstream views can reshape
    assert materialize(strided, MicroBatchSpec(rows=(0, 1, 2, 3), width=16))[
        "input_ids"
    ].is_contiguous()
    reordered = materialize(batch, MicroBatchSpec(rows=(1, 0, 2, 3), width=16))
    assert torch.equal(reordered["input_ids"], batch["input_ids"][[1, 0, 2, 3]])
    narrower = materialize(batch, MicroBatchSpec(rows=(0, 1, 2, 3), width=12))
    assert torch.equal(narrower["input_ids"], batch["input_ids"][:, :12])
    padded = pad_sequence_dim(whole, 32)
    assert padded["input_ids"].shape == (4, 32) and not padded["attention_mask"][:, 16:].any()


def test_row_extents_reach_the_last_real_column_whatever_the_padding():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert row_extents({"attention_mask": mask}) == [2, 3, 0, 4]


def test_balanced_order_deals_tokens_evenly():
    lengths = sorted(grpo_shaped_lengths(64, seed=2))  # worst case for contiguous shards
    order = balanced_order(lengths, 4)
    assert sorted(order) == list(range(64))
    shard_tokens = [sum(lengths[r] for r in order[i * 16 : (i + 1) * 16]) for i in range(4)]
    assert max(shard_tokens) - min(shard_tokens) <= max(lengths)


def test_pipeline_parallel_packs_share_one_length():
    lengths = [grpo_shaped_lengths(12, seed=s) for s in range(2)]
    settings = BatchingSettings(mode="packed", tokens_per_micro_batch=200, same_width=True)
    widths = {spec.pack_width for plan in plan_shards(lengths, 128, settings) for spec in plan}
    assert len(widths) == 1


# --------------------------------------------------------------------------- Automodel numbers
def grpo_batch(lengths: list[int], width: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows = len(lengths)
    input_ids = torch.randint(3, 60, (rows, width), generator=generator)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    token_mask = torch.zeros(rows, width)
    for row, length in enumerate(lengths):
        attention_mask[row, :length] = 1
        token_mask[row, min(8, length - 1) : length] = 1.0  # the response
        input_ids[row, length:] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_mask": token_mask,
        "old_logprobs": -torch.rand(rows, width, generator=generator) * 4,
        "ref_logprobs": -torch.rand(rows, width, generator=generator) * 4,  # KL term too
        "generation_logprobs": -torch.rand(rows, width, generator=generator) * 4,
        "advantages": torch.randn(rows, generator=generator),
        "num_global_sequences": torch.full((rows,), float(rows)),
    }


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    from hpcrl.core.backends.automodel.model import TokenLogprobModel, load_hf_model
    from hpcrl.core.models.tiny import ensure_tiny_model

    path = ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path_factory.mktemp("models")))
    torch.manual_seed(0)
    return TokenLogprobModel(load_hf_model(path, "cpu"))


def loss_and_grads(root, batch, settings):
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs

    root.zero_grad(set_to_none=True)
    loss_fn = functools.partial(grpo_loss, cfg=LossFnCfg(token_level_loss=False))
    num_tokens = float(batch["token_mask"].sum())
    plan = plan_shards([row_lengths(batch)], batch["input_ids"].shape[1], settings)[0]
    total = 0.0
    for spec in plan:
        micro = materialize(batch, spec)
        loss, _ = loss_fn(forward_logprobs(root, micro)[0], micro, num_tokens)
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.clone() for n, p in root.named_parameters() if p.grad is not None}
    return total, grads, plan


@pytest.mark.parametrize(
    "settings",
    [
        BatchingSettings(mode="dynamic", tokens_per_micro_batch=192, round_to=16, divisible_by=2),
        BatchingSettings(mode="packed", tokens_per_micro_batch=192, round_to=16, divisible_by=2),
        BatchingSettings(mode="packed", tokens_per_micro_batch=128, algorithm="concatenative"),
        # NeMo RL's fixed micro-batches at the batch's full width
        BatchingSettings(rows_per_micro_batch=3, same_width=True),
    ],
    ids=["dynamic", "packed-mffd", "packed-concat", "fixed-full-width"],
)
def test_automodel_losses_and_grads_equal_the_unpacked_path(tiny_root, settings):
    lengths = grpo_shaped_lengths(12, seed=4, longest=64)
    batch = grpo_batch(lengths, 64, seed=4)
    want_loss, want_grads, _ = loss_and_grads(
        tiny_root, batch, BatchingSettings(rows_per_micro_batch=3)
    )
    loss, grads, plan = loss_and_grads(tiny_root, batch, settings)
    assert any(len(spec.rows) > 1 for spec in plan)  # something really was packed/grouped
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert grads.keys() == want_grads.keys()
    worst = max(float((grads[n] - want_grads[n]).abs().max()) for n in grads)
    assert worst < 1e-5, worst


def test_packed_logprobs_equal_unpacked(tiny_root):
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs

    lengths = grpo_shaped_lengths(6, seed=8, longest=64)
    batch = grpo_batch(lengths, 64, seed=8)
    with torch.no_grad():
        want = forward_logprobs(tiny_root, batch)[0] * batch["attention_mask"]
        settings = BatchingSettings(mode="packed", tokens_per_micro_batch=512, divisible_by=4)
        (spec,) = plan_shards([lengths], 64, settings)[0]
        got = forward_logprobs(tiny_root, materialize(batch, spec))[0]
    rows = list(spec.rows)
    assert torch.allclose(got, want[rows, : got.shape[1]], atol=1e-5)


def test_pack_padded_to_a_bucket_keeps_its_logprobs(tiny_root):
    """Compiled Automodel passes pad a pack to the next sequence bucket (``pad_pack``); the
    fill is a sequence of its own, so no real token's log-prob changes."""
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs
    from hpcrl.core.workers.sharding import pad_pack, pad_sequence_dim

    lengths = grpo_shaped_lengths(6, seed=9, longest=64)
    batch = grpo_batch(lengths, 64, seed=9)
    settings = BatchingSettings(mode="packed", tokens_per_micro_batch=512, divisible_by=4)
    (spec,) = plan_shards([lengths], 64, settings)[0]
    micro = materialize(batch, spec)
    padded = pad_sequence_dim(pad_pack(micro, 64), 64)
    pack_length = micro["packed_input_ids"].shape[1]
    assert padded["packed_input_ids"].shape[1] == (pack_length // 64 + 1) * 64
    assert int(padded["cu_seqlens"][-1]) == padded["packed_input_ids"].shape[1]
    with torch.no_grad():
        want = forward_logprobs(tiny_root, micro)[0]
        got = forward_logprobs(tiny_root, padded)[0]
    assert got.shape[1] == -(-want.shape[1] // 64) * 64  # the rows' own bucket, zeros
    assert torch.allclose(got[:, : want.shape[1]], want, atol=1e-5)
    assert not got[:, want.shape[1] :].any()
