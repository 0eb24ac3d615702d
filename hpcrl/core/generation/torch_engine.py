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

The waves live in ``decode_wave``, the options and counters in ``engine_options``.

Weights are the engine's own copy (in the sampling dtype), refreshed in place by
``update_weights`` from Hugging Face-named tensors (``BackendWorker.export_hf_weights``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.core.generation.decode_wave import Wave, WaveLimits, column_bucket, row_bucket
from hpcrl.core.generation.decoder import Decoder
from hpcrl.core.generation.engine_options import EngineOptions, GenerationStats
from hpcrl.core.generation.in_flight import InFlightRefits
from hpcrl.core.generation.kv_cache import DecodeState
from hpcrl.core.generation.sampling import SampleTokens, sample_tokens

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg

# Share of free accelerator memory the cache of one wave may take.
CACHE_MEMORY_FRACTION = 0.5


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
        # Through a weak reference: the bound method made a reference cycle, so an engine
        # dropped without ``shutdown`` lived until the cyclic GC ran, at any moment, and its
        # CUDA graphs and their memory pool were destroyed there (possibly in the middle of
        # another capture). Now dropping the last reference frees it at once.
        self.in_flight = InFlightRefits(_weakly_bound(self._load_in_flight))
        # Per row of the last generate: response lengths at which in-flight refits landed.
        self.last_refit_positions: list[list[int]] = []
        self.recompute_kv_cache = False  # an in-flight refit asked the running wave for it
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
        self.recompute_kv_cache = running and recompute_kv_cache

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
                    wave = Wave(
                        self,
                        [prompt_ids[r] for r in rows],
                        rows,
                        WaveLimits([limits[r] for r in rows], max_new),
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
            # A fresh pool for the new graphs: capturing into the old one, released by its
            # graphs while a block of it lived on, failed ("use_count > 0" INTERNAL ASSERT in
            # the caching allocator; torch 2.11, an H100, tests/gpu/test_engine_waves.py)
            self._graph_pool = None
            self._state = DecodeState(
                self.decoder, rows, columns, self.options.decode_attention,
                self.options.decode_launch,
            )  # fmt: skip
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
        """Warm up once on a side stream (the step is idempotent: same inputs, same writes),
        then capture; all graphs share one memory pool (they never run concurrently). One
        warm-up run, not two: it makes every lazy first-call set-up (a Triton kernel's
        specialisation and load, cuBLAS's choice) happen outside the capture, and a second
        only repeats the run; the five captures of a first step spent ~0.3 s of host time in
        the Triton launcher alone (an H200 profile, docs/performance.md, item 3)."""
        import torch

        state = self._state
        assert state is not None
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
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


def _weakly_bound(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` called through a weak reference to its object."""
    weak = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = weak()
        assert bound is not None, "the engine was dropped while a refit was handed over"
        bound(*args)

    return call
