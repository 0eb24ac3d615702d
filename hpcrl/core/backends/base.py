"""The worker-side backend interface: what one rank of a training backend must do.

The controller holds a ``RayPolicy`` (``hpcrl.core.workers.group``); it starts one Ray actor
per GPU (or CPU slot), and each actor holds exactly one ``BackendWorker`` instance, chosen by
class path from ``hpcrl.core.backends.worker_class_path(recipe.backend)``. Every method
below is called on *all* ranks together (they are collectives), in the same order, with each
rank's own share of the data. The actor owns the process group: it exports RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT before ``setup`` and destroys the group
after ``close``; a backend only builds its meshes / parallel state on top of it.

Data conventions are those of ``hpcrl.core.policy`` (CPU tensors in, CPU tensors out,
batch-first, ``logprobs[:, 0] == 0``). The actor moves nothing to the device: backends do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import Recipe
    from hpcrl.core.policy import Batch, LossFn
    from hpcrl.core.workers.micro_batches import MicroBatchSpec


@attrs.frozen(kw_only=True)
class RankInfo:
    """Where one worker sits, and what the plan decided for it (device, the Megatron
    checkpoint dir as the job sees it); assigned by the controller before ``setup``."""

    rank: int
    world_size: int
    local_rank: int  # index among the workers of this node
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    device: str  # "cuda" or "cpu"
    # JobSpec.megatron_checkpoint_dir: where HF→Megatron conversions live (Megatron only).
    megatron_checkpoint_dir: str | None = None
    # JobSpec.colocated_engine_ranks: consecutive ranks per colocated vLLM engine.
    engine_ranks: int = 1
    # A folder every node sees (in the run folder): the refit files of a colocated engine
    # whose ranks span several nodes (hpcrl.core.generation.vllm_nodes).
    engine_refit_dir: str | None = None


@attrs.frozen(kw_only=True)
class DataParallelPlace:
    """How a rank takes part in data parallelism; returned by ``BackendWorker.setup``.

    The controller splits every global batch into ``dp_size`` equal contiguous shards and
    gives shard ``dp_rank`` to every rank with that ``dp_rank`` (TP/CP/PP peers get the same
    shard). Exactly one rank per ``dp_rank`` has ``returns_results`` set; only its outputs
    (log-probs, generations) are gathered.
    """

    dp_rank: int
    dp_size: int
    returns_results: bool


class BackendWorker(Protocol):
    """One rank of a training backend (Automodel, Megatron). Constructed with no arguments."""

    def setup(self, recipe: Recipe, rank_info: RankInfo, model_path: str) -> DataParallelPlace:
        """Load the HF checkpoint at ``model_path`` (a local folder), apply parallelism,
        build optimizer and LR scheduler. The process group already exists."""

    def train_step(
        self, micro_batches: Sequence[Batch], loss_fn: LossFn, num_global_tokens: float
    ) -> dict[str, float]:
        """Forward/backward every micro-batch of this rank's shard (all ranks get the same
        number of micro-batches; a micro-batch holding ``packed_input_ids`` is a pack of
        ``hpcrl.core.workers.micro_batches``, whose log-probs the backend unpacks to the
        micro-batch's rows before ``loss_fn``), then clip gradients and take one optimizer and scheduler
        step. ``loss_fn`` returns a loss already normalised by ``num_global_tokens``; the
        backend makes gradients equal those of the sum over all data-parallel shards.
        Returns the same dict on every rank: ``loss`` (summed over micro-batches and
        data-parallel ranks, i.e. the global-batch loss), ``grad_norm`` (before clipping),
        ``lr`` (used for this step), and each ``loss_fn`` metric summed the same way."""

    def logprobs(self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None) -> torch.Tensor:
        """Token log-probs [b, T] (float32, CPU) of this rank's shard, current weights, in
        the micro-batches of ``plan`` (the controller's; None: logprob_batch_size rows)."""

    def reference_logprobs(
        self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None
    ) -> torch.Tensor:
        """As ``logprobs`` but under the frozen initial weights of ``model_path``."""

    def export_hf_weights(self) -> Sequence[tuple[str, torch.Tensor]]:
        """The current weights as full tensors with Hugging Face names, on every rank
        (gathering shards is a collective). What refits a generation engine
        (``hpcrl.core.generation.engine``); the tensors may alias live parameters, so a
        caller copies them before the next optimizer step."""

    def offload_optimizer(self) -> None:
        """Move optimizer state off the accelerator (before generation); no-op on CPU."""

    def onload_optimizer(self) -> None:
        """Undo ``offload_optimizer``."""

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Write model, optimizer, scheduler and this rank's RNG state under
        ``checkpoint_dir`` (shared by all ranks; the controller writes ``extra_state``)."""

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore everything ``save_checkpoint`` wrote, so the run continues exactly."""

    def export_hf(self, out_dir: str) -> None:
        """Write a consolidated HF checkpoint (weights, config, tokenizer) to ``out_dir``
        (rank 0 writes; every rank takes part in gathering)."""

    def collect_state(self) -> Mapping[str, Any]:
        """Small picklable facts for logs and tests; must hold ``step`` (optimizer steps
        taken, restored by ``load_checkpoint``: manual GC counts from it) and
        ``peak_memory_gb`` (accelerator peak, 0 on CPU)."""

    def take_pass_metrics(self) -> Mapping[str, float]:
        """Figures of the train and log-prob passes since the last call, as per-step metrics
        (``hpcrl.core.backends.pass_stats``: micro-batches, token slots against real tokens,
        worker seconds); empty where a backend keeps none."""

    def close(self) -> None:
        """Free model, optimizer and meshes (the actor then destroys the process group)."""
