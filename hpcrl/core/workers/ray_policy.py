"""``RayPolicy``: the controller-side ``hpcrl.core.policy.Policy`` over a ``RayWorkerGroup``.

Splits global batches into equal data-parallel shards (ranks with the same ``dp_rank`` get
the same shard), gathers results from one rank per shard in ``dp_rank`` order, and keeps
checkpoints atomic (written to ``<dir>.partial``, renamed when every rank is done).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.core.workers.group import GroupLayout, RayWorkerGroup
from hpcrl.core.workers.micro_batches import (
    BatchingSettings,
    Purpose,
    balanced_order,
    plan_shards,
    row_extents,
    row_lengths,
)
from hpcrl.core.workers.sharding import (
    batch_size_of,
    concat_right_padded,
    pad_prompts_evenly,
    pad_rows,
    split_batch,
)

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe
    from hpcrl.core.generation.engine import ShardGeneration
    from hpcrl.core.policy import Batch, LossFn

EXTRA_STATE_FILE = "extra_state.json"


def torch_index(order: list[int]) -> torch.Tensor:
    import torch

    return torch.tensor(order, dtype=torch.long)


@attrs.frozen(kw_only=True)
class GenerationResult:
    """Concrete ``hpcrl.core.policy.GenerationOutput`` (CPU tensors, right-padded)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor
    # [B] vLLM's own count per row (its request stats); None for the torch engine.
    engine_generated_tokens: torch.Tensor | None = None
    metrics: dict[str, float] = attrs.field(factory=dict)


TENSOR_FIELDS = (
    "input_ids",
    "attention_mask",
    "response_mask",
    "generation_logprobs",
    "prompt_lengths",
    "response_lengths",
)
# Fields only some engines return (vLLM's own token counts).
OPTIONAL_TENSOR_FIELDS = ("engine_generated_tokens",)


def join_shards(
    shards: Sequence[ShardGeneration], num_real: int, pad_token_id: int
) -> GenerationResult:
    """Shards in prompt order → one result without the rows added to even out the shards."""
    from hpcrl.core.generation.engine import combine_shard_metrics

    joined = concat_right_padded([s.fields for s in shards], {"input_ids": pad_token_id})
    return GenerationResult(
        **{key: joined[key][:num_real] for key in TENSOR_FIELDS},
        **{key: joined[key][:num_real] for key in OPTIONAL_TENSOR_FIELDS if key in joined},
        metrics=combine_shard_metrics([s.metrics for s in shards]),
    )


class RayPolicy:
    """Implements ``hpcrl.core.policy.Policy`` for any backend worker class."""

    def __init__(
        self,
        recipe: Recipe,
        model_path: str,
        layout: GroupLayout,
        worker_class_path: str,
        *,
        pad_token_id: int = 0,
        setup_timeout_s: float = 900.0,
        progress: Callable[[str], None] | None = None,
        actor_class: type | None = None,
    ) -> None:
        """``actor_class``: the Ray actor class (``TrainingWorker`` or a test subclass)."""
        self.recipe = recipe
        self.pad_token_id = pad_token_id
        self.group = RayWorkerGroup(layout, worker_class_path, progress, actor_class)
        try:
            self.group.start(recipe, model_path, timeout_s=setup_timeout_s)
        except BaseException:
            self.group.shutdown()
            raise
        self.dp_size = self.group.places[0].dp_size
        self._batching: dict[Purpose, BatchingSettings] = {
            purpose: BatchingSettings.from_recipe(recipe, purpose)
            for purpose in ("train", "logprobs")
        }
        self._result_ranks = self._pick_result_ranks()

    def _pick_result_ranks(self) -> list[int]:
        """Rank that returns results for each dp_rank, in dp_rank order."""
        by_dp = {p.dp_rank: r for r, p in enumerate(self.group.places) if p.returns_results}
        assert sorted(by_dp) == list(range(self.dp_size)), f"bad dp layout {self.group.places}"
        return [by_dp[d] for d in range(self.dp_size)]

    def _shard_args(self, shards: list[Any], *rest: Any) -> list[tuple[Any, ...]]:
        import ray

        shard_refs = [ray.put(s) for s in shards]
        rest_refs = tuple(ray.put(r) for r in rest)
        return [(shard_refs[p.dp_rank], *rest_refs) for p in self.group.places]

    def _planned_args(
        self, batch: Batch, purpose: Purpose, what: str, *rest: Any
    ) -> tuple[list[tuple[Any, ...]], list[int]]:
        """Per-rank (shard, plan, *rest) and the row order the shards were cut from: packing
        and dynamic batching deal rows to shards by length (similar work per rank)."""
        import ray

        settings = self._batching[purpose]
        order = list(range(batch_size_of(batch)))
        if settings.mode != "fixed":
            order = balanced_order(row_lengths(batch), self.dp_size)
            index = torch_index(order)
            batch = {key: value.index_select(0, index) for key, value in batch.items()}
        shards = split_batch(batch, self.dp_size, what)
        plans = plan_shards([row_extents(s) for s in shards], batch["input_ids"].shape[1], settings)
        shard_refs = [ray.put(s) for s in shards]
        plan_refs = [ray.put(p) for p in plans]
        rest_refs = tuple(ray.put(r) for r in rest)
        args = [
            (shard_refs[p.dp_rank], plan_refs[p.dp_rank], *rest_refs) for p in self.group.places
        ]
        return args, order

    def _gather(self, per_rank: list[Any]) -> list[Any]:
        return [per_rank[r] for r in self._result_ranks]

    # ------------------------------------------------------------------ Policy
    def train(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        # At least 1: a batch whose every token is masked (overlong filtering) gives loss 0.
        num_global_tokens = max(float(batch["token_mask"].sum()), 1.0)
        args, _ = self._planned_args(
            batch, "train", "policy.train_global_batch_size", loss_fn, num_global_tokens
        )
        # The actor's signature is (shard, loss_fn, num_global_tokens, plan).
        args = [(shard, fn, tokens, plan) for shard, plan, fn, tokens in args]
        return self.group.call_all("train", args)[0]

    def _logprobs(self, method: str, batch: Batch) -> torch.Tensor:
        import torch

        # Any batch size: ranks must run equally many forwards, so pad and trim afterwards.
        padded, num_real = pad_rows(batch, self.dp_size)
        args, order = self._planned_args(padded, "logprobs", "log-prob batch")
        joined = torch.cat(self._gather(self.group.call_all(method, args)))
        restored = torch.empty_like(joined)
        restored[torch_index(order)] = joined
        return restored[:num_real]

    def get_logprobs(self, batch: Batch) -> torch.Tensor:
        return self._logprobs("logprobs", batch)

    def get_reference_logprobs(self, batch: Batch) -> torch.Tensor:
        return self._logprobs("reference_logprobs", batch)

    def generate(
        self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int
    ) -> GenerationResult:
        """Every rank samples its data-parallel shard with its colocated engine; with
        engines spanning ``n`` ranks, each group's first rank samples the group's shard."""
        import ray

        ranks_per_engine = self.group.layout.engine_ranks
        if ranks_per_engine == 1:
            shards, num_real = pad_prompts_evenly(prompt_ids, self.dp_size)
            args = self._shard_args(shards, cfg, seed)
            parts = self._gather(self.group.call_all("generate", args))
            return join_shards(parts, num_real, self.pad_token_id)
        world = self.group.layout.world_size
        shards, num_real = pad_prompts_evenly(prompt_ids, world // ranks_per_engine)
        cfg_ref, seed_ref, nothing = ray.put(cfg), ray.put(seed), ray.put([])
        shard_refs = [ray.put(shard) for shard in shards]
        args = [
            (shard_refs[rank // ranks_per_engine] if rank % ranks_per_engine == 0 else nothing,
             cfg_ref, seed_ref)
            for rank in range(world)
        ]  # fmt: skip
        per_rank = self.group.call_all("generate", args)
        parts = per_rank[::ranks_per_engine]  # the groups' first ranks, in engine order
        assert all(part is not None for part in parts), "every group's first rank samples"
        return join_shards(parts, num_real, self.pad_token_id)

    def put_hf_weights(self) -> Any:
        """The current weights in Ray's object store, put once (for separate engines)."""
        refs = [ref for ref in self.group.call_all("put_hf_weights") if ref is not None]
        assert len(refs) == 1, "exactly rank 0 puts the weights"
        return refs[0]

    def prepare_for_generation(self) -> None:
        self.group.call_all("offload_optimizer")

    def prepare_for_training(self) -> None:
        self.group.call_all("onload_optimizer")

    def save_checkpoint(self, checkpoint_dir: str, extra_state: Mapping[str, Any]) -> None:
        partial_dir = checkpoint_dir.rstrip("/") + ".partial"
        shutil.rmtree(partial_dir, ignore_errors=True)
        os.makedirs(partial_dir)
        self.group.call_same("save_checkpoint", partial_dir)
        with open(os.path.join(partial_dir, EXTRA_STATE_FILE), "w") as handle:
            json.dump(dict(extra_state), handle, indent=1, sort_keys=True)
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        os.rename(partial_dir, checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        extra_path = os.path.join(checkpoint_dir, EXTRA_STATE_FILE)
        if not os.path.exists(extra_path):
            raise FileNotFoundError(
                f"{checkpoint_dir} is not a complete hpcrl checkpoint ({EXTRA_STATE_FILE} "
                "missing); point at a folder written by save_checkpoint"
            )
        self.group.call_same("load_checkpoint", checkpoint_dir)
        with open(extra_path) as handle:
            return json.load(handle)

    def export_hf(self, out_dir: str) -> None:
        self.group.call_same("export_hf", out_dir)

    def collect_state(self) -> list[Mapping[str, Any]]:
        """Per-rank facts (step, peak memory), rank order."""
        return self.group.call_all("collect_state")

    def shutdown(self) -> None:
        self.group.shutdown()
