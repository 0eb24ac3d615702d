"""One wave of ``TorchEngine.generate``: a batch of rows from prefill to the last token.

The wave prefills its prompts, then decodes one token per step for every live row, samples
on the device, and every ``check_every_tokens`` steps looks on the host: stop strings, how
many rows still run, and compaction into a smaller row bucket. It reads the engine through
``WaveEngine`` (the engine's cache, decode step, sampler, tokenizer and counters), so this
module does not import the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from hpcrl.core.generation.engine_options import EngineOptions, GenerationStats
from hpcrl.core.generation.in_flight import InFlightRefits
from hpcrl.core.generation.kv_cache import DecodeState
from hpcrl.core.generation.sampling import row_uniforms
from hpcrl.core.token_distribution import TokenDistribution

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg


class WaveEngine(Protocol):
    """What a wave uses of its engine (``TorchEngine``)."""

    options: EngineOptions
    device: torch.device
    pad_token_id: int
    last_stats: GenerationStats
    _state: DecodeState | None
    sample_tokens: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    in_flight: InFlightRefits  # in-flight refits land between two decode steps
    last_refit_positions: list[list[int]]  # per row of the call: where they landed
    recompute_kv_cache: bool  # the refit that just landed asks for the cache again

    def decode_step(self, rows: int, columns: int) -> None: ...

    def tokenizer(self) -> Any: ...


def row_bucket(count: int) -> int:
    """Smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, … (2^k and 1.5·2^k) holding ``count``."""
    size = 1
    while size < count:
        if size >= 2 and size * 3 // 2 >= count:
            return size * 3 // 2
        size *= 2
    return size


def column_bucket(columns: int, step: int, capacity: int) -> int:
    return min(capacity, -(-columns // step) * step)


@attrs.frozen
class WaveLimits:
    """How many tokens each row of a wave may generate, and the call's largest limit (the
    width of the wave's token buffers)."""

    rows: list[int]
    width: int


class Wave:
    """One batch of rows from prefill to the last token."""

    def __init__(
        self,
        engine: WaveEngine,
        prompts: list[Sequence[int]],
        row_ids: list[int],
        limits: WaveLimits,
        cfg: GenerationCfg,
        seed: int,
        stops: tuple[int, ...],
    ) -> None:
        import torch

        self.engine, self.prompts, self.cfg, self.seed = engine, prompts, cfg, seed
        self.row_ids = row_ids
        self.distribution = TokenDistribution.of_generation(cfg)
        state = engine._state
        assert state is not None
        self.state = state
        device = engine.device
        count = len(prompts)
        self.count = count
        self.slots = row_bucket(count)  # slots in use; ≥ count (the rest are idle)
        self.end_column = len(prompts[0])  # prompts come longest first
        # Slot -> wave row (count = the scratch row that idle slots write to).
        self.slot_rows = torch.full((state.rows,), count, dtype=torch.long, device=device)
        self.slot_rows[:count] = torch.arange(count, device=device)
        self.global_rows = torch.tensor([*row_ids, 0], dtype=torch.long, device=device)
        self.finished = torch.ones(state.rows, dtype=torch.bool, device=device)
        self.finished[:count] = False
        # Idle slots compute garbage that nobody reads; keep their indices in range.
        state.tokens[count:].fill_(engine.pad_token_id)
        state.positions[count:].zero_()
        max_new = limits.width
        self.num_steps = max(limits.rows)
        # Only when some row must stop before the last step: the common case adds no work.
        self.capped = min(limits.rows) < self.num_steps
        # The scratch row (idle slots) never reaches its limit.
        self.limits = torch.tensor([*limits.rows, max_new + 1], dtype=torch.long, device=device)
        self.tokens = torch.full((count + 1, max_new), engine.pad_token_id, device=device)
        self.logprobs = torch.zeros((count + 1, max_new), dtype=torch.float32, device=device)
        self.lengths = torch.zeros(count + 1, dtype=torch.long, device=device)
        self.stops = torch.tensor(stops, dtype=torch.long, device=device) if stops else None
        # Every uniform the wave can draw, [wave row, token index], hashed once: the same
        # values a per-token ``row_uniforms`` call gives (a pure function of seed, row and
        # index), without its ~60 tiny kernels per token.
        token_index = torch.arange(max_new, dtype=torch.long, device=device)[None, :]
        self.uniforms = row_uniforms(seed, self.global_rows[:, None], token_index)

    def run(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        stats = self.engine.last_stats
        options = self.engine.options
        started = time.perf_counter()
        self.state.prefill(self.prompts, self.end_column, options.prefill_tokens_per_chunk)
        stats.prefill_s += _synchronized_elapsed(self.engine.device, started)
        started = time.perf_counter()
        num_steps = self.num_steps
        for index in range(num_steps):
            if index > 0:
                if self.engine.in_flight.at_step_boundary():
                    self._after_refit(index)
                self._decode(index)
            self._sample(index)
            last = index + 1 == num_steps
            if (
                not last
                and (index + 1) % options.check_every_tokens == 0
                and not self._check(index)
            ):
                break
        self._apply_stop_strings(num_steps - 1)
        stats.decode_s += _synchronized_elapsed(self.engine.device, started)
        count = self.count
        return self.tokens[:count], self.logprobs[:count], self.lengths[:count]

    def _after_refit(self, index: int) -> None:
        """New weights landed before token ``index``: record where, per row; with
        ``recompute_kv_cache`` prefill every slot's prompt + tokens ``:index - 1`` again
        with them (token ``index - 1`` is the next decode step's input)."""
        engine = self.engine
        engine.last_stats.refits_in_flight += 1
        lengths = self.lengths[: self.count].tolist()
        finished = self.finished.tolist()
        live_rows = {
            row for slot, row in enumerate(self.slot_rows[: self.slots].tolist())
            if row < self.count and not finished[slot]
        }  # fmt: skip
        for row in sorted(live_rows):
            engine.last_refit_positions[self.row_ids[row]].append(lengths[row])
        if not engine.recompute_kv_cache:
            return
        engine.recompute_kv_cache = False
        tokens = self.tokens[:, : index - 1].tolist()
        sequences = [
            [*self.prompts[min(row, self.count - 1)], *tokens[min(row, self.count - 1)]]
            for row in self.slot_rows[: self.slots].tolist()
        ]  # idle slots (the scratch row) take a real row's: nobody reads them
        self.state.prefill(
            sequences, self.end_column + index - 1, engine.options.prefill_tokens_per_chunk
        )
        engine.last_stats.recomputes += 1

    def _decode(self, index: int) -> None:
        """Token ``index`` for every slot: feed token ``index - 1`` at its column."""
        column = self.end_column + index - 1
        engine, state = self.engine, self.state
        state.column.fill_(column)
        columns = column_bucket(column + 1, engine.options.column_bucket, state.columns)
        engine.decode_step(self.slots, columns)
        state.positions[: self.slots] += 1
        engine.last_stats.decode_steps += 1
        engine.last_stats.row_steps += self.slots

    def _sample(self, index: int) -> None:
        """Token ``index`` of every slot from the logits the last step left.

        Not part of the decode step's CUDA graph: the host never waits for the device
        between tokens, so it enqueues these few kernels while the replay still runs (as
        long as a step takes the device longer than the host needs to enqueue one token's
        work), and a graph would only save the device the microseconds between them.
        Capturing them would take a graph per (rows, columns, distribution, greedy), the
        token index as a device tensor, the wave's buffers owned by the engine and an
        idempotent capture warm-up (``lengths`` is accumulated here)."""
        import torch

        slots, state = self.slots, self.state
        rows = self.slot_rows[:slots]
        uniforms = self.uniforms[:, index].index_select(0, rows)
        chosen, chosen_logprobs = self.engine.sample_tokens(
            state.logits[:slots], self.distribution, uniforms, greedy=self.cfg.temperature == 0
        )
        active = ~self.finished[:slots]
        self.tokens[rows, index] = torch.where(active, chosen, self.engine.pad_token_id)
        self.logprobs[rows, index] = torch.where(active, chosen_logprobs, 0.0)
        self.lengths.index_add_(0, rows, active.long())
        if self.stops is not None:
            self.finished[:slots] |= active & torch.isin(chosen, self.stops)
        if self.capped:
            reached = self.lengths.index_select(0, rows) >= self.limits.index_select(0, rows)
            self.finished[:slots] |= reached
        state.tokens[:slots].copy_(chosen)

    def _check(self, index: int) -> bool:
        """Host look (one synchronisation): stop strings, then compaction. False: all done."""
        self._apply_stop_strings(index)
        live = (~self.finished[: self.slots]).nonzero()[:, 0]
        if live.numel() == 0:
            return False
        target = row_bucket(live.numel())
        if self.engine.options.compact and target < self.slots:
            self._compact(live, target, self.end_column + index)
        return True

    def _compact(self, live: torch.Tensor, target: int, columns: int) -> None:
        import torch

        filler = live[:1].expand(target - live.numel())
        keep = torch.cat([live, filler])
        self.state.compact(keep, columns)
        self.slot_rows[:target] = self.slot_rows.index_select(0, keep)
        self.slot_rows[live.numel() : target] = self.count
        self.finished[:target] = True
        self.finished[: live.numel()] = False
        self.slots = target
        self.engine.last_stats.compactions += 1

    def _apply_stop_strings(self, index: int) -> None:
        """Cut rows at the first token that completes a stop string (checked on the host)."""
        if not self.cfg.stop_strings:
            return
        tokenizer = self.engine.tokenizer()
        lengths = self.lengths[: self.count].tolist()
        tokens = self.tokens[: self.count, : index + 1].tolist()
        slot_of_row = {row: slot for slot, row in enumerate(self.slot_rows[: self.slots].tolist())}
        for row, (row_tokens, length) in enumerate(zip(tokens, lengths, strict=True)):
            cut = _stop_string_cut(tokenizer, row_tokens[:length], self.cfg.stop_strings)
            if cut is None:
                continue
            self.lengths[row] = cut
            if row in slot_of_row:
                self.finished[slot_of_row[row]] = True


def _stop_string_cut(tokenizer: Any, tokens: list[int], stop_strings: Sequence[str]) -> int | None:
    """Shortest prefix length whose text contains a stop string, or None."""
    if not tokens or not any(s in tokenizer.decode(tokens) for s in stop_strings):
        return None
    for length in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:length])
        if any(stop in text for stop in stop_strings):
            return length
    return len(tokens)


def _synchronized_elapsed(device: torch.device, started: float) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
