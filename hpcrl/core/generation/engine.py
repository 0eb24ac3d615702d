"""The one generation seam: what a worker's engine does, and the spec every engine is built from.

A training worker (``hpcrl.core.workers.actor.TrainingWorker``) holds at most one colocated
engine; separate generation workers (``hpcrl.core.workers.vllm_workers``) hold one each. Both
kinds of engine, hpcrl's ``TorchEngine`` and ``VllmEngine``, take the same calls:

- ``generate(prompt_ids, cfg, seed)`` → ``GenerationOutput``'s fields for one shard;
- ``update_weights(named_tensors)`` with Hugging Face-named full tensors, which is what
  every backend's ``export_hf_weights()`` returns (the refit);
- ``weights_version``: the owner's label of the weights loaded (refit when it lags);
- ``generation_metrics()``: figures of the last ``generate`` (may be empty);
- ``shutdown()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe, VllmCfg
    from hpcrl.core.generation.engine_devices import EngineDevices, EngineNodeRank
    from hpcrl.core.generation.vllm_nodes import EngineNodeWorkers

# Sampling precision of the torch engine on GPUs (CPU engines run in float32).
_TORCH_DTYPES = ("float32", "bfloat16", "float16")


class GenerationEngine(Protocol):
    """One sampling engine (see the module docstring)."""

    weights_version: int

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], cfg: GenerationCfg, seed: int
    ) -> dict[str, torch.Tensor]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def generation_metrics(self) -> dict[str, float]: ...

    def shutdown(self) -> None: ...


@attrs.frozen(kw_only=True)
class ShardGeneration:
    """A worker's answer to ``generate``: the fields of its shard and its figures."""

    fields: dict[str, Any]  # GenerationOutput's fields, CPU tensors
    metrics: dict[str, float]


@attrs.frozen(kw_only=True)
class EngineSpec:
    """What an engine of a run is built from (picklable: crosses Ray)."""

    backend: Literal["torch", "vllm"]
    model_path: str
    tokenizer_path: str
    device: str  # "cuda" | "cpu"
    precision: str  # torch engine on GPUs; vLLM reads vllm_cfg.precision
    seed: int
    max_model_len: int | None
    vllm_cfg: Any = None  # VllmCfg (vLLM only)
    vllm_kwargs: dict[str, Any] = attrs.field(factory=dict)  # policy.generation.vllm_kwargs
    hf_config_overrides: dict[str, Any] = attrs.field(factory=dict)  # policy.hf_config_overrides

    @property
    def needs_optimizer_memory(self) -> bool:
        """Whether a colocated engine needs the optimizer state off the GPU while it samples.

        Colocated vLLM claims ``gpu_memory_utilization`` of the device for itself (NeMo RL
        moves the optimizer state to the host before its refit, too). The torch engine
        sizes its cache from the memory that is free when it is built (in the first step,
        before the optimizer has state) and keeps it: moving twice the parameters' worth of
        Adam state off the GPU and back around every generation would only cost time (two
        copies of the Adam moments per step; measured: docs/performance.md, "Figures behind the code"). Should a later step need
        a larger cache than fits, the engine samples in waves instead."""
        return self.backend == "vllm" and self.device == "cuda"

    def llm_kwargs(self) -> dict[str, Any]:
        """The ``vllm.LLM`` / ``EngineArgs`` keyword arguments of this engine (vLLM only):
        the one place the spec's settings become vLLM's, for the engine and for the
        workers of its other nodes alike."""
        from hpcrl.core.generation.vllm_engine import engine_kwargs

        assert self.backend == "vllm", "the torch engine takes no vLLM arguments"
        return engine_kwargs(
            self.model_path,
            self.vllm_cfg,
            device=self.device,
            seed=self.seed,
            max_model_len=self.max_model_len,
            extra_kwargs=self.vllm_kwargs,
            hf_overrides=self.hf_config_overrides,
        )

    def build(
        self, devices: EngineDevices | None = None, node: EngineNodeRank | None = None
    ) -> GenerationEngine:
        """``devices``: a colocated engine spanning several training ranks (vLLM only);
        ``node``: node rank 0 of one whose ranks span several nodes."""
        if self.backend == "vllm":
            from hpcrl.core.generation.vllm_engine import VllmEngine

            return VllmEngine(self, devices=devices, node=node)
        assert devices is None and node is None, "the torch engine runs inside its rank"
        return self._build_torch()

    def build_node_workers(
        self, devices: EngineDevices | None, node: EngineNodeRank
    ) -> EngineNodeWorkers:
        """The workers of node rank ``node.node_rank`` > 0 of a vLLM engine across nodes."""
        from hpcrl.core.generation.vllm_nodes import EngineNodeWorkers

        return EngineNodeWorkers(self, node, devices=devices)

    def _build_torch(self) -> GenerationEngine:
        import torch

        from hpcrl.core.generation.torch_engine import TorchEngine
        from hpcrl.core.models.hf_config import load_hf_config

        assert self.precision in _TORCH_DTYPES, self.precision
        dtype = getattr(torch, self.precision) if self.device == "cuda" else torch.float32
        return TorchEngine(
            load_hf_config(self.model_path, self.hf_config_overrides),
            device=self.device,
            dtype=dtype,
            max_model_len=self.max_model_len,
            tokenizer_path=self.tokenizer_path,
        )


def engine_spec(recipe: Recipe, model_path: str, device: str) -> EngineSpec:
    """The engine ``recipe`` samples with (vLLM's whether colocated or not)."""
    generation = recipe.policy.generation
    algorithm = recipe.grpo if recipe.grpo is not None else recipe.sft
    vllm_cfg: VllmCfg | None = generation.vllm_cfg if generation.backend == "vllm" else None
    return EngineSpec(
        # megatron: NeMo RL's in-process generation from the Megatron policy's weights, which
        # hpcrl's torch engine does from the refit (hpcrl.config.generation_rules)
        backend="vllm" if generation.backend == "vllm" else "torch",
        model_path=model_path,
        tokenizer_path=recipe.policy.tokenizer.name or model_path,
        device=device,
        precision=recipe.policy.precision,
        seed=algorithm.seed if algorithm is not None else 0,
        max_model_len=recipe.policy.max_total_sequence_length,
        vllm_cfg=vllm_cfg,
        vllm_kwargs=dict(generation.vllm_kwargs) if vllm_cfg is not None else {},
        hf_config_overrides=dict(recipe.policy.hf_config_overrides),
    )


def colocated_engine_spec(recipe: Recipe, model_path: str, device: str) -> EngineSpec | None:
    """The spec of the engine each training worker holds; None when generation runs on
    separate workers (vLLM engines, or the torch sampler of non-colocated Megatron generation)."""
    if not recipe.policy.generation.colocated.enabled:
        return None
    return engine_spec(recipe, model_path, device)


def shard_seed(seed: int, shard_index: int) -> int:
    """Different shards draw different samples; the same shard the same ones."""
    return (seed * 1_000_003 + shard_index) % (2**31 - 1)


def combine_shard_metrics(per_shard: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Shards run side by side: times are the slowest shard's, counts add up."""
    combined: dict[str, float] = {}
    for metrics in per_shard:
        for key, value in metrics.items():
            if key.startswith("time_"):
                combined[key] = max(combined.get(key, 0.0), value)
            else:
                combined[key] = combined.get(key, 0.0) + value
    return combined
