"""``TorchEngine``: hpcrl's own decode engine behind the generation seam
(``hpcrl.core.generation.engine.GenerationEngine``).

One ``generate`` call: prompts sorted longest first (less padding), split into waves that
fit the cache, each wave prefilled over packed tokens, then decoded one token per step for
every live row. On CUDA each ``(rows, columns)`` bucket of the decode step is captured once
as a CUDA graph and replayed; sampling runs on the device with counter-based randomness, so
the host never waits for the device between tokens. On CUDA the sampler is compiled too
(``sampling.fused_sampler``): temperature, top-k / top-p, log-softmax, the inverse-CDF pick
and the chosen token's log-prob in a few fused kernels, right after the graph's replay.
Every ``check_every_tokens`` steps the host reads how many rows are still running: it stops
when none are, applies stop strings, and moves the live rows into a smaller row bucket
(``compact``) so finished rows stop costing work. On CPU the same code runs without graphs
or fused kernels (the eager ``sampling.sample_tokens``).

Weights are the engine's own copy (in the sampling dtype), refreshed in place by
``update_weights`` from Hugging Face-named tensors (``BackendWorker.export_hf_weights``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.core.generation.decoder import Decoder
from hpcrl.core.generation.in_flight import InFlightRefits
from hpcrl.core.generation.kv_cache import DecodeAttention, DecodeState
from hpcrl.core.generation.sampling import SampleTokens, row_uniforms, sample_tokens
from hpcrl.core.token_distribution import TokenDistribution

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg

# Share of free accelerator memory the cache of one wave may take.
CACHE_MEMORY_FRACTION = 0.5


@attrs.frozen(kw_only=True)
class EngineOptions:
    """How the engine runs; the defaults are the fast path on each device."""

    cuda_graphs: bool = True  # CUDA only
    fuse_pointwise: bool = True  # CUDA only: torch.compile the norm / rotary / SiLU pieces
    # CUDA only, and only with fuse_pointwise (False there: nothing compiled at all):
    # torch.compile the sampler (sampling.fused_sampler)
    fuse_sampling: bool = True
    check_every_tokens: int = 16  # host looks at the finished count this often
    compact: bool = True
    max_rows: int | None = None  # None: as many as CACHE_MEMORY_FRACTION of free memory holds
    prefill_tokens_per_chunk: int = 16384  # padded tokens per prefill attention chunk
    # Decode attention reads the cache up to the next multiple of this: finer buckets read
    # fewer unused columns, at one more CUDA graph per bucket (captured once, when first met).
    column_bucket: int = 32
    # "bmm": two batched matmuls and the softmax; "sdpa": scaled_dot_product_attention;
    # "triton": the cache write and the attention in two Triton kernels (triton_attention)
    decode_attention: DecodeAttention = "bmm"


@attrs.define
class GenerationStats:
    """What one ``generate`` call did (also summed into ``lifetime``)."""

    waves: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    row_steps: int = 0  # sum over decode steps of the rows computed (the work done)
    compactions: int = 0
    graph_captures: int = 0
    generated_tokens: int = 0
    refits_in_flight: int = 0  # in-flight refits that landed between two decode steps
    recomputes: int = 0  # of those, the ones that prefilled the wave's cache again

    def as_metrics(self) -> dict[str, float]:
        return {
            "time_prefill_s": self.prefill_s,
            "time_decode_s": self.decode_s,
            "generation_waves": float(self.waves),
            "generation_decode_steps": float(self.decode_steps),
            "generation_row_steps": float(self.row_steps),
            "generation_compactions": float(self.compactions),
            "generation_graph_captures": float(self.graph_captures),
            "generation_refits_in_flight": float(self.refits_in_flight),
            "generation_kv_recomputes": float(self.recomputes),
        }


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


class TorchEngine:
    """A decode engine for Llama/Qwen2/Qwen3/Mistral-style models (see ``decoder``)."""

    def __init__(
        self,
        config: Any,
        *,
        device: str | torch.device,
        dtype: torch.dtype,
        max_model_len: int | None = None,
        options: EngineOptions | None = None,
        tokenizer_path: str | None = None,
        tokenizer: Any = None,
    ) -> None:
        import torch

        self.options = options or EngineOptions()
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.decoder = Decoder(config, self.device, dtype)
        on_cuda = self.device.type == "cuda"
        if on_cuda and self.options.fuse_pointwise:
            from hpcrl.core.generation.decoder import Pointwise

            self.decoder.pointwise = Pointwise.fused()
        self.sample_tokens: SampleTokens = sample_tokens
        if on_cuda and self.options.fuse_pointwise and self.options.fuse_sampling:
            from hpcrl.core.generation.sampling import fused_sampler

            self.sample_tokens = fused_sampler()
        self.use_graphs = on_cuda and self.options.cuda_graphs
        self.max_model_len = max_model_len
        self.tokenizer_path = tokenizer_path
        self._tokenizer: Any = tokenizer
        eos = getattr(config, "eos_token_id", None)
        self.eos_token_ids: tuple[int, ...] = tuple(
            eos if isinstance(eos, list) else [] if eos is None else [eos]
        )
        pad = getattr(config, "pad_token_id", None)
        self.pad_token_id: int = pad if pad is not None else (self.eos_token_ids or (0,))[0]
        self.weights_version = -1  # nothing loaded yet
        self.in_flight = InFlightRefits(self._load_in_flight)
        # Per row of the last generate: response lengths at which in-flight refits landed.
        self.last_refit_positions: list[list[int]] = []
        self._recompute_kv_cache = False  # an in-flight refit asked the running wave for it
        self.last_stats = GenerationStats()
        self.lifetime = GenerationStats()
        self._state: DecodeState | None = None
        self._graphs: dict[tuple[int, int], Any] = {}
        self._graph_pool: Any = None

    @classmethod
    def from_hf_model(cls, model: Any, **kwargs: Any) -> TorchEngine:
        """An engine with ``model``'s config, device, dtype and (copied) weights."""
        parameter = next(model.parameters())
        kwargs.setdefault("device", parameter.device)
        kwargs.setdefault("dtype", parameter.dtype)
        engine = cls(model.config, **kwargs)
        engine.update_weights(model.state_dict().items())
        return engine

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the engine's weights (in place; graphs stay valid)."""
        self.decoder.load(named_tensors)
        self.weights_version += 1

    def update_weights_in_flight(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], recompute_kv_cache: bool
    ) -> bool:
        """Load new weights between two decode steps of the running generation (from another
        thread; ``hpcrl.core.generation.in_flight``), or now when idle: the rows in flight
        sample their next tokens with them; ``recompute_kv_cache``: after the wave's cache
        is prefilled again (prompt + tokens so far) with them. True when one was running."""
        return self.in_flight.update(list(named_tensors), recompute_kv_cache)

    def _load_in_flight(
        self, named_tensors: list[tuple[str, torch.Tensor]], recompute_kv_cache: bool, running: bool
    ) -> None:
        self.update_weights(named_tensors)
        self._recompute_kv_cache = running and recompute_kv_cache

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        cfg: GenerationCfg,
        seed: int,
        *,
        stop_token_ids: Sequence[int] | None = None,
    ) -> dict[str, torch.Tensor]:
        """One response per prompt, in prompt order; ``GenerationOutput``'s fields (CPU).

        ``stop_token_ids`` None: the config's EOS ids plus ``cfg.stop_token_ids``."""
        import torch

        from hpcrl.core.generation.padding import assemble_right_padded, pad_prompts

        if self.weights_version < 0:
            raise RuntimeError("TorchEngine.generate before update_weights: no weights loaded")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        stops = tuple(self.eos_token_ids) if stop_token_ids is None else tuple(stop_token_ids)
        stops = tuple(sorted(set(stops) | set(cfg.stop_token_ids)))
        self.last_stats = stats = GenerationStats()
        self.last_refit_positions = [[] for _ in prompt_ids]
        limits = self.new_token_limits(prompt_ids, cfg.max_new_tokens)
        num_rows, max_new = len(prompt_ids), max(limits, default=0)
        tokens = torch.full((num_rows, max_new), self.pad_token_id, dtype=torch.long)
        logprobs = torch.zeros((num_rows, max_new), dtype=torch.float32)
        lengths = torch.zeros(num_rows, dtype=torch.long)
        order = sorted(range(num_rows), key=lambda row: -len(prompt_ids[row]))
        if num_rows and max_new:
            wave_rows = self._prepare_capacity(order, prompt_ids, limits)
            with self.in_flight.generating():
                for start in range(0, num_rows, wave_rows):
                    rows = order[start : start + wave_rows]
                    wave = _Wave(
                        self,
                        [prompt_ids[r] for r in rows],
                        rows,
                        _WaveLimits([limits[r] for r in rows], max_new),
                        cfg,
                        seed,
                        stops,
                    )
                    wave_tokens, wave_logprobs, wave_lengths = wave.run()
                    index = torch.tensor(rows, dtype=torch.long)
                    tokens[index], logprobs[index], lengths[index] = (
                        wave_tokens.cpu(),
                        wave_logprobs.cpu(),
                        wave_lengths.cpu(),
                    )
                    stats.waves += 1
        stats.generated_tokens = int(lengths.sum())
        self._add_to_lifetime(stats)
        input_ids, attention_mask = pad_prompts(prompt_ids, self.pad_token_id)
        prompt_lengths = attention_mask.sum(dim=1).to(torch.long)
        return assemble_right_padded(
            input_ids, attention_mask, prompt_lengths, tokens, logprobs, lengths, self.pad_token_id
        )

    def new_token_limits(
        self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int
    ) -> list[int]:
        """Tokens each row may generate: ``max_new_tokens``, at most what its prompt leaves of
        ``max_model_len`` (NeMo RL's vLLM workers cap each request the same way)."""
        if self.max_model_len is None:
            return [max_new_tokens] * len(prompt_ids)
        limits = [min(max_new_tokens, self.max_model_len - len(p)) for p in prompt_ids]
        if any(limit < 1 for limit in limits):
            longest = max(len(p) for p in prompt_ids)
            raise ValueError(
                f"a prompt of {longest} tokens leaves no room to generate within the engine's "
                f"max_model_len={self.max_model_len} (policy.max_total_sequence_length): "
                "prompts must be shorter (the GRPO loop cuts those that are not)"
            )
        return limits

    def generation_metrics(self) -> dict[str, float]:
        return self.last_stats.as_metrics()

    def _add_to_lifetime(self, stats: GenerationStats) -> None:
        for field in attrs.fields(GenerationStats):
            total = getattr(self.lifetime, field.name) + getattr(stats, field.name)
            setattr(self.lifetime, field.name, total)

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if self.tokenizer_path is None:
                raise ValueError(
                    "policy.generation.stop_strings needs a tokenizer: build the engine with "
                    "tokenizer_path"
                )
            from hpcrl.core.models.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.tokenizer_path)
        return self._tokenizer

    # ------------------------------------------------------------------ capacity
    def _prepare_capacity(
        self, order: Sequence[int], prompt_ids: Sequence[Sequence[int]], limits: Sequence[int]
    ) -> int:
        """Make sure the cache fits a wave; returns the rows per wave. A wave's rows decode
        into shared columns after its longest prompt, so the cache holds that prompt plus the
        largest limit (more than max_model_len when short prompts may generate long
        responses; every row's own positions stay within max_model_len)."""
        columns_needed = len(prompt_ids[order[0]]) + max(limits)
        window = self.decoder.shape.sliding_window
        if window is not None and columns_needed > window:
            from hpcrl.core.generation.decoder import UnsupportedModelError

            raise UnsupportedModelError(
                f"sequences of {columns_needed} tokens exceed the model's sliding_window={window}; "
                "the torch sampler has no sliding-window attention: set "
                "policy.generation.backend=vllm or shorten policy.max_total_sequence_length"
            )
        step = self.options.column_bucket
        columns = column_bucket(max(columns_needed, self.max_model_len or 0), step, 1 << 30)
        wanted_rows = row_bucket(len(order))
        max_rows = self.options.max_rows or self._rows_that_fit(columns)
        rows = min(wanted_rows, max_rows)
        state = self._state
        if state is None or state.rows < rows or state.columns < columns:
            rows = max(rows, state.rows if state else 0)
            columns = max(columns, state.columns if state else 0)
            self._state = None
            self._graphs.clear()  # they point at the old buffers
            self._state = DecodeState(self.decoder, rows, columns, self.options.decode_attention)
        return rows

    def _rows_that_fit(self, columns: int) -> int:
        import torch

        if self.device.type != "cuda":
            return 1 << 30
        shape = self.decoder.shape
        per_row = (
            (shape.num_layers * 2 * shape.num_kv_heads * columns * shape.head_dim)
            * self.decoder.embed.element_size()
            + shape.vocab * 4
            + columns
        )
        free, _total = torch.cuda.mem_get_info(self.device)
        held = self._state.num_bytes if self._state is not None else 0
        rows = int(CACHE_MEMORY_FRACTION * (free + held) // per_row)
        size = 1
        while size * 2 <= rows:
            size *= 2
        return size

    # ------------------------------------------------------------------ decode steps
    def decode_step(self, rows: int, columns: int) -> None:
        """Run (or replay) the decode step of bucket ``(rows, columns)``."""
        state = self._state
        assert state is not None
        if not self.use_graphs:
            state.decode_forward(rows, columns)
            return
        graph = self._graphs.get((rows, columns))
        if graph is None:
            graph = self._capture(rows, columns)
            self._graphs[(rows, columns)] = graph
            self.last_stats.graph_captures += 1
        graph.replay()

    def _capture(self, rows: int, columns: int) -> Any:
        """Warm up on a side stream (the step is idempotent: same inputs, same writes), then
        capture; all graphs share one memory pool (they never run concurrently)."""
        import torch

        state = self._state
        assert state is not None
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                state.decode_forward(rows, columns)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads' CUDA calls (NCCL's watchdog in a training worker)
        # must not invalidate this capture.
        with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
            state.decode_forward(rows, columns)
        return graph

    def shutdown(self) -> None:
        self._graphs.clear()
        self._state = None
        self._graph_pool = None


@attrs.frozen
class _WaveLimits:
    """How many tokens each row of a wave may generate, and the call's largest limit (the
    width of the wave's token buffers)."""

    rows: list[int]
    width: int


class _Wave:
    """One batch of rows from prefill to the last token."""

    def __init__(
        self,
        engine: TorchEngine,
        prompts: list[Sequence[int]],
        row_ids: list[int],
        limits: _WaveLimits,
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
        if not engine._recompute_kv_cache:
            return
        engine._recompute_kv_cache = False
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
