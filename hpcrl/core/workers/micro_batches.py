"""How a data-parallel shard is cut into micro-batches: fixed, dynamic or packed.

NeMo RL's three ways, chosen once from the recipe (``BatchingSettings.from_recipe``):

- **fixed** (default): ``train_micro_batch_size`` / ``logprob_batch_size`` consecutive rows,
  each micro-batch cut to its own last real column (NeMo RL pads every micro-batch to the
  batch's longest row; with right-padded rows and causal attention the cut columns change
  no value, they only cost work). Pipeline parallelism keeps the batch's full width.
- **dynamic** (``policy.dynamic_batching``): rows sorted by length and grouped so that rows ×
  width stays within ``train_mb_tokens`` / ``logprob_mb_tokens``; each micro-batch is cut to
  its own longest row, rounded up to ``sequence_length_round``.
- **packed** (``policy.sequence_packing``): rows bin-packed into micro-batches of at most
  that many tokens, each micro-batch one row of concatenated sequences whose attention and
  positions restart at every boundary (``cu_seqlens``; the backend's packed forward).

In every mode each row's width is a multiple of ``make_sequence_length_divisible_by`` (each
sequence's, when packed). The loss never sees a pack: backends unpack log-probs back to
``[rows, width]`` before the loss runs, so losses equal the unpacked path's up to float
rounding (tests/core/test_micro_batches.py states the tolerance).

Planning is plain Python on row lengths (the controller plans every shard at once, so all
data-parallel ranks run equally many micro-batches, as FSDP's collectives need);
``materialize`` builds one micro-batch's tensors on the worker.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from hpcrl.config.moe_dispatch import pack_multiple

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import Recipe
    from hpcrl.core.policy import Batch

Mode = Literal["fixed", "dynamic", "packed"]
Purpose = Literal["train", "logprobs"]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@attrs.frozen(kw_only=True)
class BatchingSettings:
    """What one kind of pass (train or log-probs) asks for."""

    mode: Mode = "fixed"
    rows_per_micro_batch: int = 1  # fixed mode
    tokens_per_micro_batch: int = 0  # dynamic / packed budget
    round_to: int = 1  # sequence_length_round (dynamic: width; packed: pack length)
    divisible_by: int = 1  # make_sequence_length_divisible_by
    algorithm: str = "modified_first_fit_decreasing"
    same_width: bool = False  # pipeline parallelism: every micro-batch one shape
    seed: int = 0  # first_fit_shuffle

    @classmethod
    def from_recipe(cls, recipe: Recipe, purpose: Purpose) -> BatchingSettings:
        policy = recipe.policy
        rows = policy.train_micro_batch_size
        if purpose == "logprobs":
            rows = policy.logprob_batch_size or policy.train_micro_batch_size
        cp_multiple = _context_parallel_multiple(recipe)
        common: dict[str, Any] = {
            "rows_per_micro_batch": rows,
            "divisible_by": math.lcm(
                max(1, policy.make_sequence_length_divisible_by or 1), cp_multiple
            ),
            "same_width": recipe.backend == "megatron"
            and policy.megatron_cfg.pipeline_model_parallel_size > 1,
        }
        modes: tuple[tuple[Mode, Any], ...] = (
            ("packed", policy.sequence_packing),
            ("dynamic", policy.dynamic_batching),
        )
        for mode, cfg in modes:
            if cfg.enabled:
                budget = cfg.train_mb_tokens if purpose == "train" else cfg.logprob_mb_tokens
                algorithm = getattr(cfg, "algorithm", "modified_first_fit_decreasing")
                return cls(
                    mode=mode,
                    tokens_per_micro_batch=int(budget or policy.max_total_sequence_length),
                    round_to=math.lcm(
                        cfg.sequence_length_round,
                        cp_multiple,
                        pack_multiple(recipe) if mode == "packed" else 1,
                    ),
                    algorithm=algorithm,
                    seed=_seed_of(recipe),
                    **common,
                )
        return cls(**common)


def _context_parallel_multiple(recipe: Recipe) -> int:
    """Megatron's context parallelism cuts every sequence into 2·CP chunks (each split over
    TP too under sequence parallelism): packed sequences and pack lengths must divide so, as
    NeMo RL pads them. Unpacked rows are padded by the backend's step itself."""
    cfg = recipe.policy.megatron_cfg
    if recipe.backend != "megatron" or cfg.context_parallel_size <= 1:
        return 1
    tp = cfg.tensor_model_parallel_size if cfg.sequence_parallel else 1
    return 2 * cfg.context_parallel_size * tp


def _seed_of(recipe: Recipe) -> int:
    section = recipe.grpo if recipe.grpo is not None else recipe.sft
    return int(section.seed) if section is not None else 0


@attrs.frozen(kw_only=True)
class MicroBatchSpec:
    """One micro-batch of a shard: which rows, how wide; for a pack, each row's padded
    length inside it and the pack's total length."""

    rows: tuple[int, ...]
    width: int
    pack_lengths: tuple[int, ...] | None = None
    pack_width: int = 0

    @property
    def packed(self) -> bool:
        return self.pack_lengths is not None

    @property
    def tokens(self) -> int:
        """Token slots the forward computes (the cost this micro-batch pays)."""
        return self.pack_width if self.packed else len(self.rows) * self.width


# --------------------------------------------------------------------------- planning
def plan_shards(
    lengths_per_shard: Sequence[Sequence[int]], full_width: int, settings: BatchingSettings
) -> list[list[MicroBatchSpec]]:
    """Micro-batches of every shard, equally many per shard."""
    plans = [_plan_one(lengths, full_width, settings) for lengths in lengths_per_shard]
    target = max(len(plan) for plan in plans)
    plans = [_split_until(plan, lengths, target, settings) for plan, lengths in
             zip(plans, lengths_per_shard, strict=True)]  # fmt: skip
    if settings.same_width:
        plans = _one_shape(plans, settings)
    return plans


def balanced_order(lengths: Sequence[int], num_shards: int) -> list[int]:
    """A permutation of rows such that cutting it into ``num_shards`` equal contiguous
    shards gives every shard a similar token count (longest first, dealt round-robin)."""
    by_length = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    return [row for shard in range(num_shards) for row in by_length[shard::num_shards]]


def _plan_one(lengths: Sequence[int], full_width: int, s: BatchingSettings) -> list[MicroBatchSpec]:
    if s.mode == "fixed":
        step = s.rows_per_micro_batch
        groups = [
            tuple(range(i, min(i + step, len(lengths)))) for i in range(0, len(lengths), step)
        ]
        full = round_up(full_width, s.divisible_by)
        return [MicroBatchSpec(rows=g, width=full if s.same_width else _fixed_width(lengths, g, s))
                for g in groups]  # fmt: skip
    if s.mode == "dynamic":
        return _plan_dynamic(lengths, s)
    return _plan_packed(lengths, s)


def _fixed_width(lengths: Sequence[int], rows: Sequence[int], s: BatchingSettings) -> int:
    return round_up(max(max(lengths[r] for r in rows), 1), s.divisible_by)


def _dynamic_width(lengths: Sequence[int], rows: Sequence[int], s: BatchingSettings) -> int:
    return round_up(max(lengths[r] for r in rows), math.lcm(s.round_to, s.divisible_by))


def _plan_dynamic(lengths: Sequence[int], s: BatchingSettings) -> list[MicroBatchSpec]:
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    groups: list[list[int]] = []
    for row in order:
        if groups:
            trial = [*groups[-1], row]
            if len(trial) * _dynamic_width(lengths, trial, s) <= s.tokens_per_micro_batch:
                groups[-1] = trial
                continue
        groups.append([row])
    return [MicroBatchSpec(rows=tuple(g), width=_dynamic_width(lengths, g, s)) for g in groups]


def _pack_spec(lengths: Sequence[int], rows: Sequence[int], s: BatchingSettings) -> MicroBatchSpec:
    padded = tuple(round_up(lengths[r], s.divisible_by) for r in rows)
    return MicroBatchSpec(
        rows=tuple(rows),
        width=max(lengths[r] for r in rows),
        pack_lengths=padded,
        pack_width=round_up(sum(padded), s.round_to),
    )


def _plan_packed(lengths: Sequence[int], s: BatchingSettings) -> list[MicroBatchSpec]:
    sizes = [round_up(length, s.divisible_by) for length in lengths]
    too_long = [row for row, size in enumerate(sizes) if size > s.tokens_per_micro_batch]
    if too_long:
        raise ValueError(
            f"policy.sequence_packing: a sequence of {sizes[too_long[0]]} tokens does not fit "
            f"a pack of {s.tokens_per_micro_batch}; raise train_mb_tokens/logprob_mb_tokens to "
            "at least policy.max_total_sequence_length"
        )
    bins = pack_bins(sizes, s.tokens_per_micro_batch, s.algorithm, s.seed)
    return [_pack_spec(lengths, sorted(rows), s) for rows in bins]


def _split_until(
    plan: list[MicroBatchSpec], lengths: Sequence[int], target: int, s: BatchingSettings
) -> list[MicroBatchSpec]:
    """Split the micro-batch with the most rows in two until there are ``target`` of them:
    fewer rows never exceed a token budget, and a shard has at least ``target`` rows."""
    plan = list(plan)
    while len(plan) < target:
        index = max(range(len(plan)), key=lambda i: (len(plan[i].rows), plan[i].tokens))
        rows = plan[index].rows
        assert len(rows) > 1, "a shard with fewer rows than micro-batches"
        halves = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
        plan[index : index + 1] = [_respec(plan[index], half, lengths, s) for half in halves]
    return plan


def _respec(
    old: MicroBatchSpec, rows: Sequence[int], lengths: Sequence[int], s: BatchingSettings
) -> MicroBatchSpec:
    if old.packed:
        return _pack_spec(lengths, rows, s)
    if s.mode == "dynamic":
        return MicroBatchSpec(rows=tuple(rows), width=_dynamic_width(lengths, rows, s))
    return MicroBatchSpec(rows=tuple(rows), width=old.width)


def _one_shape(
    plans: list[list[MicroBatchSpec]], s: BatchingSettings
) -> list[list[MicroBatchSpec]]:
    """Pipeline stages exchange fixed-size buffers: every pack gets the longest pack length."""
    if s.mode != "packed":
        return plans
    longest = max(spec.pack_width for plan in plans for spec in plan)
    return [[attrs.evolve(spec, pack_width=longest) for spec in plan] for plan in plans]


# --------------------------------------------------------------------------- bin packing
def pack_bins(
    sizes: Sequence[int], capacity: int, algorithm: str, seed: int = 0
) -> list[list[int]]:
    """Item indices per bin, every bin's total at most ``capacity``."""
    if algorithm == "concatenative":
        return _concatenative(sizes, capacity)
    if algorithm == "first_fit_shuffle":
        order = list(range(len(sizes)))
        random.Random(seed).shuffle(order)
        return _first_fit(order, sizes, capacity, [])
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    if algorithm == "first_fit_decreasing":
        return _first_fit(order, sizes, capacity, [])
    assert algorithm == "modified_first_fit_decreasing", f"unknown packing algorithm {algorithm}"
    return _modified_first_fit_decreasing(order, sizes, capacity)


def _concatenative(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    bins: list[list[int]] = [[]]
    used = 0
    for item, size in enumerate(sizes):
        if bins[-1] and used + size > capacity:
            bins.append([])
            used = 0
        bins[-1].append(item)
        used += size
    return bins


def _first_fit(
    order: Sequence[int], sizes: Sequence[int], capacity: int, bins: list[list[int]]
) -> list[list[int]]:
    loads = [sum(sizes[i] for i in b) for b in bins]
    for item in order:
        for index, load in enumerate(loads):
            if load + sizes[item] <= capacity:
                bins[index].append(item)
                loads[index] += sizes[item]
                break
        else:
            bins.append([item])
            loads.append(sizes[item])
    return bins


def _modified_first_fit_decreasing(
    order: Sequence[int], sizes: Sequence[int], capacity: int
) -> list[list[int]]:
    """Johnson & Garey's MFFD: a bin per large item (> C/2); medium items (> C/3) join them
    largest-first; then pairs of small items (> C/6) fill what is left, smallest bins of
    room first; everything else first-fit, decreasing."""
    large = [i for i in order if sizes[i] > capacity / 2]
    medium = [i for i in order if capacity / 3 < sizes[i] <= capacity / 2]
    small = [i for i in order if capacity / 6 < sizes[i] <= capacity / 3]
    bins = [[i] for i in large]
    loads = [sizes[i] for i in large]
    for item in medium:
        for index in range(len(bins)):
            if loads[index] + sizes[item] <= capacity:
                bins[index].append(item)
                loads[index] += sizes[item]
                break
    placed = {i for b in bins for i in b}
    small_left = [i for i in small]
    for index in sorted(range(len(bins)), key=lambda b: -loads[b]):
        room = capacity - loads[index]
        pair = _smallest_pair(small_left, sizes, room)
        if pair is not None:
            bins[index] += pair
            loads[index] += sum(sizes[i] for i in pair)
            small_left = [i for i in small_left if i not in pair]
    placed |= {i for b in bins for i in b}
    rest = [i for i in order if i not in placed]
    return _first_fit(rest, sizes, capacity, bins)


def _smallest_pair(items: Sequence[int], sizes: Sequence[int], room: int) -> list[int] | None:
    """The two smallest items (``items`` is largest-first) if together they fit ``room``."""
    if len(items) < 2:
        return None
    pair = [items[-1], items[-2]]
    return pair if sizes[pair[0]] + sizes[pair[1]] <= room else None


# --------------------------------------------------------------------------- tensors
def row_lengths(batch: Batch) -> list[int]:
    """Real tokens per row; rows must be right-padded (1s, then 0s)."""
    mask = batch["attention_mask"]
    lengths = mask.sum(dim=1)
    positions = mask.new_ones(mask.shape).cumsum(dim=1)
    prefix = (positions <= lengths[:, None]).to(mask.dtype)
    assert bool((prefix == mask).all()), "packing and dynamic batching need right-padded rows"
    return [int(n) for n in lengths.tolist()]


def materialize(
    shard: Batch, spec: MicroBatchSpec, pad_token_id: int = 0
) -> dict[str, torch.Tensor]:
    """The micro-batch's tensors: every [b, T] key cut (or padded) to ``spec.width``, every
    [b] key taken per row; a pack adds ``packed_input_ids`` / ``packed_position_ids`` [1, L],
    ``cu_seqlens`` [n+1] (int32, segment boundaries; a tail fill is one more segment) and
    ``pack_index`` [n, width] (where row r's token t sits in the pack)."""
    import torch

    full_width = shard["input_ids"].shape[1]
    if _whole_shard(shard, spec, full_width):
        # One micro-batch of every row at full width (a GPU step's usual plan): the shard's
        # own tensors; cutting copies would only delay the step's first kernel (~0.2 ms of
        # host time on an H200's host, docs/performance.md item 1, eighth session).
        return dict(shard)
    index = torch.tensor(spec.rows, dtype=torch.long)
    micro = {}
    for key, value in shard.items():
        rows = value.index_select(0, index)
        if value.dim() == 2 and value.shape[1] == full_width:
            rows = _fit_width(rows, spec.width, pad_token_id if key == "input_ids" else 0)
        micro[key] = rows
    if spec.packed:
        micro.update(_pack_tensors(micro, spec, pad_token_id))
    return micro


def _whole_shard(shard: Batch, spec: MicroBatchSpec, full_width: int) -> bool:
    rows = len(shard["input_ids"])
    return (
        not spec.packed
        and spec.width == full_width
        and spec.rows == tuple(range(rows))
        and all(len(value) == rows and value.is_contiguous() for value in shard.values())
    )


def _fit_width(value: torch.Tensor, width: int, pad: int) -> torch.Tensor:
    import torch.nn.functional as F

    if value.shape[1] >= width:
        return value[:, :width]
    return F.pad(value, (0, width - value.shape[1]), value=pad)


def _pack_tensors(micro: dict, spec: MicroBatchSpec, pad_token_id: int) -> dict[str, torch.Tensor]:
    import torch

    assert spec.pack_lengths is not None
    ids, positions, boundaries, starts = [], [], [0], []
    for row, padded in enumerate(spec.pack_lengths):
        starts.append(boundaries[-1])
        ids.append(_fit_width(micro["input_ids"][row : row + 1], padded, pad_token_id)[0])
        positions.append(torch.arange(padded))
        boundaries.append(boundaries[-1] + padded)
    fill = spec.pack_width - boundaries[-1]
    if fill > 0:
        ids.append(torch.full((fill,), pad_token_id, dtype=micro["input_ids"].dtype))
        positions.append(torch.arange(fill))
        boundaries.append(spec.pack_width)
    columns = torch.arange(spec.width)
    lengths = torch.tensor(spec.pack_lengths)
    pack_index = torch.tensor(starts)[:, None] + torch.minimum(
        columns[None, :], lengths[:, None] - 1
    )
    return {
        "packed_input_ids": torch.cat(ids)[None, :],
        "packed_position_ids": torch.cat(positions)[None, :],
        "cu_seqlens": torch.tensor(boundaries, dtype=torch.int32),
        "pack_index": pack_index,
    }


def unpack_logprobs(packed: torch.Tensor, micro: Batch) -> torch.Tensor:
    """[1, L] log-probs of a pack → [n, width] per row: column 0 is 0 (no context), padding 0.
    Differentiable (a gather), so the loss's gradient reaches the packed forward."""
    import torch

    index = micro["pack_index"].to(packed.device)
    rows = packed[0].gather(0, index.reshape(-1)).reshape(index.shape)
    keep = micro["attention_mask"].to(device=rows.device, dtype=torch.bool).clone()
    keep[:, 0] = False
    # where, not a product: top-k/top-p log-probs may be -inf, and -inf x 0 is NaN.
    return torch.where(keep, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def scatter_rows(
    pieces: Sequence[torch.Tensor], specs: Sequence[MicroBatchSpec], num_rows: int, width: int
) -> torch.Tensor:
    """Per-micro-batch [n_i, w_i] results → one float32 [num_rows, width] tensor in shard row
    order, on the pieces' device (no host round trip per piece); zero where no piece wrote."""
    import torch

    device = pieces[0].device if pieces else torch.device("cpu")
    out = torch.zeros((num_rows, width), dtype=torch.float32, device=device)
    for piece, spec in zip(pieces, specs, strict=True):
        used = min(width, piece.shape[1])
        # non_blocking: a blocking host-to-device copy would wait for the queued forwards.
        rows = torch.tensor(spec.rows, dtype=torch.long).to(device, non_blocking=True)
        out[rows, :used] = piece[:, :used].to(device=device, dtype=torch.float32)
    return out


def logprob_micro_batches(
    batch: Batch, plan: Sequence[MicroBatchSpec] | None, recipe: Recipe
) -> tuple[list[MicroBatchSpec], list[dict[str, torch.Tensor]]]:
    """The log-prob pass's micro-batches of one shard: the controller's plan, or (a backend
    driven directly, e.g. by tests) fixed ``logprob_batch_size`` rows."""
    if plan is None:
        settings = attrs.evolve(BatchingSettings.from_recipe(recipe, "logprobs"), mode="fixed")
        plan = plan_shards([row_extents(batch)], batch["input_ids"].shape[1], settings)[0]
    keys = ("input_ids", "attention_mask")
    inputs = {key: batch[key] for key in keys}
    return list(plan), [materialize(inputs, spec) for spec in plan]


def row_extents(batch: Batch) -> list[int]:
    """Per row, one past its last real column (0 for an empty row): the width a micro-batch
    of it needs whatever its padding; for right-padded rows, the row's length."""
    import torch

    mask = batch["attention_mask"].bool()
    columns = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return [int(n) for n in torch.where(mask, columns, 0).amax(dim=1).tolist()]
