"""``VllmPolicy``: a training ``Policy`` whose ``generate`` runs on vLLM engines.

Everything but generation goes to the training policy (a ``RayPolicy``) unchanged. The
engines always sample with the trainer's latest weights: every ``train`` (and
``load_checkpoint``) bumps a weights version, and the next ``generate`` refits the engines
first (in place, prefix cache reset) — i.e. once after every training step.

Two placements (``policy.generation.colocated.enabled``):

- colocated: one engine inside every training worker (built on first use through
  ``TrainingWorker.run``); each rank samples its own data-parallel shard and refits from its
  backend's gathered weights. On GPUs ``prepare_for_generation`` moves the optimizer state
  off the device first (the backend's ``offload_optimizer``, which Megatron skips when its
  optimizer CPU offload owns placement) and the engine's share is bounded by
  ``vllm_cfg.gpu_memory_utilization`` / ``kv_cache_memory_mb``.
- separate: ``GenerationGroup``, its own placement group of engine actors
  (``colocated.resources``: nodes × GPUs, ``tensor_parallel_size`` GPUs per engine); after
  each step rank 0 of the trainer puts the gathered weights into Ray's object store once and
  every engine loads them from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.core.generation.vllm_engine import VllmEngine
from hpcrl.core.generation.vllm_refit import gathered_hf_weights

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe
    from hpcrl.core.policy import Batch, LossFn
    from hpcrl.plan.jobspec import GenerationPlacement

# Attribute of a training worker's backend object that holds its colocated engine.
ENGINE_ATTR = "_hpcrl_vllm_engine"


@attrs.frozen(kw_only=True)
class EngineSpec:
    """What every engine of a run is built from (picklable: crosses Ray)."""

    model_path: str
    vllm_cfg: Any  # VllmCfg
    device: str  # "cuda" | "cpu"
    seed: int
    max_model_len: int | None

    def build(self) -> VllmEngine:
        return VllmEngine(
            self.model_path,
            self.vllm_cfg,
            device=self.device,
            seed=self.seed,
            max_model_len=self.max_model_len,
        )


def engine_spec(recipe: Recipe, model_path: str, device: str) -> EngineSpec:
    algorithm = recipe.grpo if recipe.grpo is not None else recipe.sft
    return EngineSpec(
        model_path=model_path,
        vllm_cfg=recipe.policy.generation.vllm_cfg,
        device=device,
        seed=algorithm.seed if algorithm is not None else 0,
        max_model_len=recipe.policy.max_total_sequence_length,
    )


def shard_seed(seed: int, shard_index: int) -> int:
    """Different shards draw different samples; the same shard the same ones."""
    return (seed * 1_000_003 + shard_index) % (2**31 - 1)


# ---------------------------------------------------------------------- colocated (worker side)
def colocated_generate(
    backend: Any,
    shard: Sequence[Sequence[int]],
    cfg: GenerationCfg,
    seed: int,
    weights_version: int,
    spec: EngineSpec,
) -> dict[str, torch.Tensor]:
    """Runs on every training rank (together): build/refit this rank's engine, sample."""
    import torch.distributed as dist

    engine = getattr(backend, ENGINE_ATTR, None)
    if engine is None:
        engine = spec.build()  # from spec.model_path: the weights of version 0
        setattr(backend, ENGINE_ATTR, engine)
    if engine.weights_version != weights_version:
        engine.update_weights(gathered_hf_weights(backend))
        engine.weights_version = weights_version
    dp_rank = backend.collect_state().get("dp_rank", dist.get_rank())
    return engine.generate(shard, cfg, shard_seed(seed, dp_rank))


def close_colocated_engine(backend: Any) -> None:
    engine = getattr(backend, ENGINE_ATTR, None)
    if engine is not None:
        engine.shutdown()
        delattr(backend, ENGINE_ATTR)


def export_weights_once(backend: Any) -> Any:
    """All ranks gather (a collective); rank 0 puts the weights into Ray's object store and
    returns the reference, the others None."""
    import ray
    import torch.distributed as dist

    weights = gathered_hf_weights(backend)
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return ray.put(weights)


# ---------------------------------------------------------------------- the policy
class VllmPolicy:
    """``hpcrl.core.policy.Policy`` = a training policy + vLLM generation."""

    def __init__(
        self, training: Any, spec: EngineSpec, generation_group: GenerationGroup | None = None
    ) -> None:
        self.training = training
        self.spec = spec
        self.generation_group = generation_group  # None: colocated
        self.weights_version = 0

    @property
    def colocated(self) -> bool:
        return self.generation_group is None

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int) -> Any:
        if not self.colocated:
            return self.collect_generation(self.submit_generation(prompt_ids, cfg, seed))
        from hpcrl.core.workers.sharding import pad_prompts_evenly

        group = self.training.group
        shards, num_real = pad_prompts_evenly(prompt_ids, self.training.dp_size)
        args = [
            (colocated_generate, shards[p.dp_rank], cfg, seed, self.weights_version, self.spec)
            for p in group.places
        ]
        per_rank = group.call_all("run", args)
        return self._joined([per_rank[r] for r in self.training._result_ranks], num_real)

    def submit_generation(
        self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int
    ) -> PendingShards:
        """Separate generation workers only: refit them to the latest weights (queued, not
        waited for), start sampling, return at once; ``collect_generation`` waits."""
        if self.colocated:
            raise ValueError(
                "overlapping generation with training needs separate generation workers; set "
                "policy.generation.colocated.enabled=false (and colocated.resources)"
            )
        self._refit_generation_group()
        assert self.generation_group is not None
        return self.generation_group.submit(prompt_ids, cfg, seed)

    def collect_generation(self, pending: PendingShards) -> Any:
        assert self.generation_group is not None
        return self._joined(self.generation_group.collect(pending), pending.num_real)

    def _joined(self, parts: list[dict[str, torch.Tensor]], num_real: int) -> Any:
        from hpcrl.core.workers.ray_policy import GenerationResult
        from hpcrl.core.workers.sharding import concat_right_padded

        joined = concat_right_padded(parts, {"input_ids": self.training.pad_token_id})
        fields = attrs.fields_dict(GenerationResult)
        return GenerationResult(**{key: joined[key][:num_real] for key in fields if key in joined})

    def _refit_generation_group(self) -> None:
        assert self.generation_group is not None
        if self.generation_group.weights_version == self.weights_version:
            return
        refs = self.training.group.call_same("run", export_weights_once)
        (weights_ref,) = [ref for ref in refs if ref is not None]
        self.generation_group.update_weights(weights_ref, self.weights_version)

    def prepare_for_generation(self) -> None:
        if self.colocated:
            self.training.prepare_for_generation()

    def prepare_for_training(self) -> None:
        if self.colocated:
            self.training.prepare_for_training()

    # ------------------------------------------------------------------ training side
    def train(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        metrics = self.training.train(batch, loss_fn)
        self.weights_version += 1
        return metrics

    def get_logprobs(self, batch: Batch) -> torch.Tensor:
        return self.training.get_logprobs(batch)

    def get_reference_logprobs(self, batch: Batch) -> torch.Tensor:
        return self.training.get_reference_logprobs(batch)

    def save_checkpoint(self, checkpoint_dir: str, extra_state: Mapping[str, Any]) -> None:
        self.training.save_checkpoint(checkpoint_dir, extra_state)

    def load_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        extra_state = self.training.load_checkpoint(checkpoint_dir)
        self.weights_version += 1
        return extra_state

    def export_hf(self, out_dir: str) -> None:
        self.training.export_hf(out_dir)

    def collect_state(self) -> list[dict[str, Any]]:
        return self.training.collect_state()

    def shutdown(self) -> None:
        try:
            if self.generation_group is not None:
                self.generation_group.shutdown()
            elif self.training.group.actors:
                self.training.group.call_same("run", close_colocated_engine)
        finally:
            self.training.shutdown()


def wrap_policy(
    training: Any,
    recipe: Recipe,
    model_path: str,
    device: str,
    placement: GenerationPlacement | None = None,
) -> Any:
    """``training`` itself for the torch sampler; a ``VllmPolicy`` around it for vLLM.
    ``placement``: the plan's separate generation workers (``JobSpec.generation``; required
    for them). On failure the training policy is shut down too (the caller never got a
    handle)."""
    generation = recipe.policy.generation
    if generation.backend != "vllm":
        return training
    spec = engine_spec(recipe, model_path, device)
    if generation.colocated.enabled:
        return VllmPolicy(training, spec)
    from hpcrl.core.generation.vllm_workers import GenerationGroup, generation_layout

    # The planner places every separate generation side (hpcrl.plan.generation).
    assert placement is not None, "separate vLLM workers need the plan's JobSpec.generation"
    group = None
    try:
        group = GenerationGroup(generation_layout(placement, device), spec)
        group.start()
    except BaseException:
        try:
            if group is not None:
                group.shutdown()
        finally:
            training.shutdown()
        raise
    return VllmPolicy(training, spec, group)


if TYPE_CHECKING:
    from hpcrl.core.generation.vllm_workers import GenerationGroup, PendingShards
