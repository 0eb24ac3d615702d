"""``VllmPolicy``: a training policy whose generation runs on separate workers (vLLM
engines; for ``policy.generation.backend: megatron``, hpcrl's torch sampler, which the same
refit feeds the Megatron policy's weights as NeMo RL's dedicated Megatron inference model).

Colocated engines (the torch engine, or vLLM with ``policy.generation.colocated.enabled``)
need no wrapper: each training worker holds its engine and ``RayPolicy.generate`` samples
through it (``hpcrl.core.workers.actor``). With generation on workers of its own
(``GenerationGroup``: a placement group of engine actors, ``colocated.resources`` nodes ×
GPUs, ``tensor_parallel_size`` GPUs per engine) this policy sends everything but generation
to the training policy unchanged, and keeps the engines on the trainer's latest weights:
every ``train`` (and ``load_checkpoint``) bumps a weights version, and the next submission
first refits the engines — rank 0 of the trainer puts the gathered weights into Ray's object
store once and every engine loads them from there. ``submit_generation`` /
``collect_generation`` (``hpcrl.core.policy.AsyncGenerationPolicy``) let async GRPO overlap
sampling with training; ``refit_in_flight`` refits the engines without waiting for the
generations they are running (``grpo.async_grpo.in_flight_weight_updates``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcrl.core.generation.engine import engine_spec
from hpcrl.core.workers.ray_policy import GenerationResult, RayPolicy, join_shards
from hpcrl.core.workers.vllm_workers import (
    GenerationGroup,
    PendingShards,
    generation_layout,
)

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe
    from hpcrl.core.policy import Batch, LossFn, Policy
    from hpcrl.run.jobspec import GenerationPlacement


class VllmPolicy:
    """``hpcrl.core.policy.AsyncGenerationPolicy``: a training policy + separate vLLM engines."""

    def __init__(self, training: RayPolicy, generation_group: GenerationGroup) -> None:
        self.training = training
        self.generation_group = generation_group
        self.weights_version = 0

    # ------------------------------------------------------------------ generation
    def generate(
        self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int
    ) -> GenerationResult:
        return self.collect_generation(self.submit_generation(prompt_ids, cfg, seed))

    def submit_generation(
        self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int
    ) -> PendingShards:
        """Refit the engines to the latest weights (queued, not waited for), start
        sampling, return at once; ``collect_generation`` waits."""
        self._refit_generation_group()
        return self.generation_group.submit(prompt_ids, cfg, seed)

    def collect_generation(self, pending: PendingShards) -> GenerationResult:
        shards = self.generation_group.collect(pending)
        return join_shards(shards, pending.num_real, self.training.pad_token_id)

    def generation_ready(self, pending: PendingShards) -> bool:
        import ray

        done, _ = ray.wait(list(pending.refs), num_returns=len(pending.refs), timeout=0)
        return len(done) == len(pending.refs)

    def _refit_generation_group(self) -> None:
        if self.generation_group.weights_version == self.weights_version:
            return
        self.generation_group.update_weights(self.training.put_hf_weights(), self.weights_version)

    def refit_in_flight(self, recompute_kv_cache: bool) -> None:
        """Refit the engines to the latest weights now, at the next step of the generations
        they are running (``grpo.async_grpo.in_flight_weight_updates``); does not wait."""
        if self.generation_group.weights_version == self.weights_version:
            return
        self.generation_group.update_weights_in_flight(
            self.training.put_hf_weights(), self.weights_version, recompute_kv_cache
        )

    def prepare_for_generation(self) -> None:
        """Nothing to move: the engines have GPUs of their own."""

    def prepare_for_training(self) -> None:
        """Nothing to move: the engines have GPUs of their own."""

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

    def collect_state(self) -> list[Mapping[str, Any]]:
        return self.training.collect_state()

    def shutdown(self) -> None:
        try:
            self.generation_group.shutdown()
        finally:
            self.training.shutdown()


def wrap_policy(
    training: RayPolicy,
    recipe: Recipe,
    model_path: str,
    device: str,
    placement: GenerationPlacement | None = None,
    refit_dir: str | None = None,
) -> Policy:
    """``training`` itself when its workers sample (colocated generation); else a
    ``VllmPolicy`` with separate engines. ``placement``: the plan's separate generation
    workers (``JobSpec.generation``; required for them); ``refit_dir``: a folder every
    generation node sees (required for engines across nodes). On failure the training policy is
    shut down too (the caller never got a handle)."""
    generation = recipe.policy.generation
    if generation.colocated.enabled:
        return training
    # The planner places every separate generation side (hpcrl.plan.generation).
    assert placement is not None, "separate engines need the plan's JobSpec.generation"
    group = None
    try:
        spec = engine_spec(recipe, model_path, device)
        group = GenerationGroup(generation_layout(placement, device), spec, refit_dir)
        group.start()
    except BaseException:
        try:
            if group is not None:
                group.shutdown()
        finally:
            training.shutdown()
        raise
    return VllmPolicy(training, group)
