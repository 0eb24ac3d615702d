"""``AutomodelWorker``: one rank of the Automodel backend (HF model + FSDP2 / HSDP / TP).

Implements ``hpcrl.core.backends.base.BackendWorker``; the process group exists before
``setup`` (the actor creates it).

Right-padded micro-batches (the batch contract's layout) run without an attention mask:
under causal attention a real token never sees the padding after it, so the mask changes no
real token's log-prob, and without it SDPA runs its causal flash kernel instead of a masked
kernel over the full S×S scores (the mask made the train step slower than a plain loop's:
docs/performance.md, "Figures behind the code"). A micro-batch that is not right-padded keeps its mask.

Compiled decoder blocks (GPU, ``automodel_cfg.torch_compile``) see the variable lengths of
GRPO batches. So that nothing recompiles after the first step: blocks are compiled with
dynamic batch and sequence sizes; every micro-batch's sequence dim is padded up to a
multiple of ``SEQUENCE_BUCKET``; no mask is passed for right-padded micro-batches, padded or
not (with a mask, a batch without padding would make Hugging Face drop it: a second graph);
log-prob micro-batches keep one row count (a single row would be specialised); log-prob
passes always run in eval mode and train passes in train mode (the mode is part of what a
compiled graph assumes).

Dynamic batching and sequence packing (``hpcrl.core.workers.micro_batches``) choose their own
widths; they go through the same buckets: a dynamic micro-batch's width is padded like any
other, a pack's row is padded to the next bucket with one more sequence (``pad_pack``). A pack
is always one row without attention mask: its graph is a second one, built in the first step.
One case still recompiles: a dynamic *train* micro-batch of a single row (one long sequence)
gets a graph specialised to one row, once, in the first step that has one (docs/algorithms.md).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from hpcrl.core.backends.automodel import checkpoint
from hpcrl.core.backends.automodel.context_parallel import check_context_parallel
from hpcrl.core.backends.automodel.expert_parallel import build_ep_mesh
from hpcrl.core.backends.automodel.first_calls import run_first_calls
from hpcrl.core.backends.automodel.logprobs import copy_policy_state, forward_logprobs, resharded
from hpcrl.core.backends.automodel.master_weights import takes_master_weights
from hpcrl.core.backends.automodel.model import TokenLogprobModel
from hpcrl.core.backends.automodel.optim import (
    build_lr_scheduler,
    build_training_optimizer,
    clip_before_step,
    host_threads_per_worker,
    move_optimizer_state,
)
from hpcrl.core.backends.automodel.parallelize import BlockCompilations, MeshShape, build_mesh
from hpcrl.core.backends.automodel.sharded_model import RankPlacement, build_sharded_model
from hpcrl.core.backends.base import DataParallelPlace, RankInfo
from hpcrl.core.backends.pass_stats import PassRecorder, PassStats, TrainSplit
from hpcrl.core.compile_stats import compiled_graph_count
from hpcrl.core.metric_reduction import accumulate, all_reduce_metrics
from hpcrl.core.policy import UNFILTERED_LOGPROBS_KEY
from hpcrl.core.token_distribution import TokenDistribution, training_distribution
from hpcrl.core.workers.device_upload import PinnedStaging
from hpcrl.core.workers.micro_batches import (
    MicroBatchSpec,
    logprob_micro_batches,
    scatter_rows,
)
from hpcrl.core.workers.sharding import is_right_padded, pad_pack, pad_rows, pad_sequence_dim

if TYPE_CHECKING:
    from hpcrl.config.recipe import Recipe
    from hpcrl.core.policy import Batch, LossFn

# Sequence lengths of compiled passes are padded to a multiple of this.
SEQUENCE_BUCKET = 64


def _check_supported(recipe: Recipe) -> None:
    """What this backend does not implement. What the planned device cannot run
    (``cpu_offload`` on CPU) the job's preflight refused already (hpcrl.core.machine_checks)."""
    cfg = recipe.policy.automodel_cfg
    check_context_parallel(recipe)
    if cfg.lora_cfg.enabled and cfg.tensor_parallel_size > 1:
        raise ValueError(
            "policy.automodel_cfg.lora_cfg: LoRA with tensor_parallel_size > 1 is not supported "
            "by the automodel backend yet; set tensor_parallel_size=1"
        )


def set_training(model: torch.nn.Module, training: bool) -> None:
    """``model.train(training)`` unless the root is in that mode already: the call walks
    every submodule (~0.3 ms of host time a pass for a 16-layer model), and only whole
    models are ever switched here."""
    if model.training != training:
        model.train(training)


def _seed_everything(recipe: Recipe, rank: int) -> None:
    """Same recipe, same numbers: every rank's RNG streams start from the algorithm seed."""
    import random

    algorithm_cfg = recipe.grpo if recipe.grpo is not None else recipe.sft
    seed = (algorithm_cfg.seed if algorithm_cfg is not None else 0) * 1_000 + rank
    random.seed(seed)
    torch.manual_seed(seed)


class AutomodelWorker:
    """Model, reference model, optimizer and scheduler of one rank."""

    # torch.compile backend of the decoder blocks; tests count compilations through it on
    # CPU (``compile_on_cpu``), where the blocks are otherwise left eager.
    compile_backend: Any = "inductor"
    compile_on_cpu: bool = False
    # bf16 compute copies of the trained linear weights, stepped by the optimizer, where the
    # recipe allows (``master_weights``); the benchmarks' baseline row turns it off.
    master_weights: bool = True
    # the compute copies' optimizer step on a stream of its own (``side_stream_adam``); the
    # benchmarks' row that steps on the one stream turns it off.
    adam_side_stream: bool = True

    def setup(self, recipe: Recipe, rank_info: RankInfo, model_path: str) -> DataParallelPlace:
        _check_supported(recipe)
        _seed_everything(recipe, rank_info.rank)
        self.recipe = recipe
        self.rank_info = rank_info
        self.model_path = model_path
        self.device = torch.device("cuda" if rank_info.device == "cuda" else "cpu")
        self.staging = PinnedStaging()
        self.distribution = training_distribution(recipe)
        cfg = recipe.policy.automodel_cfg
        self.shape = MeshShape.for_world(
            rank_info.world_size,
            cfg.dp_replicate_size,
            cfg.tensor_parallel_size,
            cfg.context_parallel_size,
        )
        self.mesh = build_mesh(rank_info.device, self.shape)
        self.cp_group = self.mesh.get_group("cp") if self.shape.cp > 1 else None
        self.ep_mesh = (
            build_ep_mesh(rank_info.device, rank_info.world_size, cfg.expert_parallel_size)
            if cfg.expert_parallel_size > 1
            else None
        )
        self.block_compilations = BlockCompilations(self.compile_backend)
        self.model = self._build_sharded(model_path, training=True)
        # Only what trains: with LoRA the adapters, never the frozen base weights. Listed
        # once: walking the module tree each step costs the host ~0.2 ms.
        self.trained_params = [param for param in self.model.parameters() if param.requires_grad]
        assert recipe.policy.optimizer is not None, "the config rules require one on Automodel"
        self.optimizer = build_training_optimizer(
            self.trained_params,
            recipe.policy.optimizer,
            copies=self.model.compute_copies,
            on_gpu=self.device.type == "cuda",
            cpu_offload=cfg.cpu_offload,
            offload_fraction=cfg.optimizer_offload_fraction,
            host_threads=(
                host_threads_per_worker(rank_info.local_world_size)
                if self.device.type == "cuda"
                else None
            ),
        )
        self.scheduler = build_lr_scheduler(self.optimizer, recipe.policy.scheduler)
        self.adam_stream = self._side_stream_adam()
        self.reference: TokenLogprobModel | None = None
        # Where the reference came from ("policy" or "checkpoint"), once built.
        self.reference_source: str | None = None
        # The policy holds the weights it loaded: no train step, no checkpoint loaded.
        self.policy_weights_initial = True
        self.step = 0
        self.passes = PassRecorder(self.device)
        preloaded = self.block_compilations.preload()  # last: what their guards read is final
        # Seconds of the kept compilations' first calls, made here (None: nothing was kept).
        self.first_calls_s: float | None = None
        if preloaded and self.compiles:
            kept = self.block_compilations.kept_call_shapes()
            fallback = (max(recipe.policy.train_micro_batch_size, 2), self.sequence_multiple)
            self.first_calls_s = run_first_calls(
                self.model,
                self.distribution,
                eval_shape=kept.get(False, fallback),
                train_shape=kept.get(True, fallback),
                device=self.device,
            )
        coords = self.mesh.get_coordinate()
        assert coords is not None
        _, _, cp_index, tp_index = coords
        # CP and TP peers hold the same data and results: one of them returns them.
        return DataParallelPlace(
            dp_rank=self._dp_rank(),
            dp_size=self.shape.dp_size,
            returns_results=tp_index == 0 and cp_index == 0,
        )

    def _build_sharded(
        self, model_path: str, *, training: bool, unloaded: bool = False
    ) -> TokenLogprobModel:
        placement = RankPlacement(
            self.rank_info.rank, self.rank_info.device, self.shape, self.mesh, self.ep_mesh
        )
        master_weights = self.master_weights and takes_master_weights(
            self.recipe, on_gpu=self.device.type == "cuda"
        )
        return build_sharded_model(
            self.recipe, placement, model_path, self.block_compilations,
            compiles=self.compiles, training=training, unloaded=unloaded,
            master_weights=master_weights,
        )  # fmt: skip

    def _side_stream_adam(self) -> Any:
        """A ``SideStreamAdam`` over the compute copies' optimizer on a GPU, else None."""
        stepped_in_stages = hasattr(self.optimizer, "step_in_stages")
        if not (self.adam_side_stream and stepped_in_stages and self.device.type == "cuda"):
            return None
        from hpcrl.core.backends.automodel.side_stream_adam import SideStreamAdam

        return SideStreamAdam(self.optimizer, self.model)

    def _settle(self) -> None:
        """What reads the weights or the optimizer state waits for the last step's update."""
        if getattr(self, "adam_stream", None) is not None:
            self.adam_stream.settle()

    @property
    def compiles(self) -> bool:
        on_device = self.device.type == "cuda" or self.compile_on_cpu
        return on_device and self.recipe.policy.automodel_cfg.torch_compile

    # ------------------------------------------------------------------ training
    @staticmethod
    def _causal_only(micro: Batch) -> bool:
        """No attention mask needed (host-side check of the CPU micro-batch)."""
        return "packed_input_ids" not in micro and is_right_padded(micro["attention_mask"])

    @property
    def sequence_multiple(self) -> int:
        """What every sequence length on the device is a multiple of: the compile bucket
        (module docstring), with sequence parallelism TP (each TP rank gets an equal slice),
        with context parallelism 2 x CP; padding never counts (``pad_sequence_dim``, ``pad_pack``)."""
        multiple = SEQUENCE_BUCKET if self.compiles else 1
        if self.recipe.policy.automodel_cfg.sequence_parallel and self.shape.tp > 1:
            multiple = math.lcm(multiple, self.shape.tp)
        # Context parallelism cuts every row into 2 x CP equal chunks.
        return math.lcm(multiple, 2 * self.shape.cp) if self.shape.cp > 1 else multiple

    def _padded(self, batch: Batch) -> Batch:
        """The sequence dim padded to ``sequence_multiple`` (host tensors)."""
        multiple = self.sequence_multiple
        if multiple > 1:
            if "packed_input_ids" in batch:
                batch = pad_pack(batch, multiple)
            batch = pad_sequence_dim(batch, multiple)
        return batch

    def _on_device(self, micro_batches: Sequence[Batch]) -> list[dict[str, torch.Tensor]]:
        """Every micro-batch padded (``_padded``) and on the device, all in one copy
        (``hpcrl.core.workers.device_upload``: no queue drain between micro-batches)."""
        return self.staging.upload([self._padded(m) for m in micro_batches], self.device)

    def train_step(
        self, micro_batches: Sequence[Batch], loss_fn: LossFn, num_global_tokens: float
    ) -> dict[str, float]:
        """Loss and metrics stay on the device until the step's one read-back (after the
        all-reduce): the host never waits for a micro-batch to finish."""
        set_training(self.model, True)
        self.policy_weights_initial = False
        real_tokens = sum(int(m["attention_mask"].sum()) for m in micro_batches)
        with self.passes.measure("train", real_tokens) as stats:
            split = TrainSplit(self.device)
            if self.model.compute_copies is not None:
                self.model.compute_copies.sum_in_fp32 = len(micro_batches) > 1
            totals = self._forward_backward(micro_batches, loss_fn, num_global_tokens, stats)
            norm = clip_before_step(
                self.optimizer, self.trained_params, self.recipe.policy.max_grad_norm
            )
            split.backward_done()
            lr = self.scheduler.get_last_lr()[0]
            if self.adam_stream is not None:
                self.adam_stream.step()
            else:
                self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            # the step's one read-back, the norm with the sums
            summed = self._sum_over_data_parallel(totals, replicated={"grad_norm": norm})
            split.finish(stats)
        return {**summed, "lr": lr}

    def _forward_backward(
        self,
        micro_batches: Sequence[Batch],
        loss_fn: LossFn,
        num_global_tokens: float,
        stats: PassStats,
    ) -> dict[str, Any]:
        """Gradients of every micro-batch; returns the summed loss and loss metrics (device
        tensors, or floats where the loss function gives floats)."""
        totals: dict[str, Any] = {"loss": 0.0}
        causal_flags = [self._causal_only(micro) for micro in micro_batches]
        on_device = self._on_device(micro_batches)
        for micro, causal_only in zip(on_device, causal_flags, strict=True):
            stats.add_micro_batch(micro)
            logprobs, unfiltered = forward_logprobs(
                self.model,
                micro,
                self.distribution,
                causal_only=causal_only,
                cp_group=self.cp_group,
            )
            if self.distribution.filters:
                micro[UNFILTERED_LOGPROBS_KEY] = unfiltered
            loss, metrics = loss_fn(logprobs, micro, num_global_tokens)
            # the forward waited for each stage of the last update; gradients come next
            self._settle()
            # FSDP averages gradients over data-parallel ranks; the loss is a share of a
            # global sum, so scale back up to get the gradient of that sum (CP peers: the
            # context_parallel module docstring).
            (loss * self.shape.dp_size).backward()
            totals["loss"] = totals["loss"] + loss.detach()
            for key, value in metrics.items():
                detached = value.detach() if isinstance(value, torch.Tensor) else value
                accumulate(totals, key, detached)
        return totals

    def _sum_over_data_parallel(
        self, values: Mapping[str, Any], replicated: Mapping[str, Any] | None = None
    ) -> dict[str, float]:
        """Sum (extrema: min/max) over data-parallel ranks; floats and device tensors alike,
        one read-back with ``replicated`` (hpcrl.core.metric_reduction)."""
        # TP and CP peers hold the same numbers: their sums count once.
        divisor = self.shape.tp * self.shape.cp
        return all_reduce_metrics(
            values, sorted(values), self.device, sum_divisor=divisor, replicated=replicated
        )

    # ------------------------------------------------------------------ log-probs
    @torch.no_grad()
    def _logprobs_with(
        self,
        kind: str,
        model: TokenLogprobModel,
        batch: Batch,
        distribution: TokenDistribution,
        plan: Sequence[MicroBatchSpec] | None,
    ) -> torch.Tensor:
        """Eval mode (no dropout), whatever the last pass left: a fixed mode per pass also
        keeps compiled blocks from recompiling on the mode flag. Compiled passes pad every
        unpacked micro-batch's rows to a multiple of ``logprob_batch_size`` (at least 2;
        repeated rows, trimmed after): a single row would be specialised. The pieces are
        assembled on the device and read back once, not once per micro-batch."""
        self._settle()
        set_training(model, False)
        policy = self.recipe.policy
        micro_size = policy.logprob_batch_size or policy.train_micro_batch_size
        specs, micro_batches = logprob_micro_batches(batch, plan, self.recipe)
        with self.passes.measure(kind, int(batch["attention_mask"].sum())) as stats:
            if self.compiles:
                micro_batches = [
                    m if "packed_input_ids" in m else pad_rows(m, max(micro_size, 2))[0]
                    for m in micro_batches
                ]
            causal_flags = [self._causal_only(micro) for micro in micro_batches]
            on_device = self._on_device(micro_batches)
            pieces = []
            for spec, micro, causal_only in zip(specs, on_device, causal_flags, strict=True):
                stats.add_micro_batch(micro)
                processed, _ = forward_logprobs(
                    model, micro, distribution, causal_only=causal_only, cp_group=self.cp_group
                )
                pieces.append(processed[: len(spec.rows)])
            return scatter_rows(pieces, specs, *batch["input_ids"].shape).cpu()

    def logprobs(self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None) -> torch.Tensor:
        return self._logprobs_with("logprobs", self.model, batch, self.distribution, plan)

    def reference_logprobs(
        self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None
    ) -> torch.Tensor:
        if self.reference is None:
            # Built on first use (all ranks call together): SFT never pays for it.
            self.reference = self._build_reference()
        logprobs = self._logprobs_with(
            "reference", self.reference, batch, self.distribution.without_filters(), plan
        )
        if self.recipe.policy.automodel_cfg.reference_on_host:
            # FSDP keeps a root's gathered weights (embeddings, lm_head) after its forward
            resharded(self.reference)
        return logprobs

    def _build_reference(self) -> TokenLogprobModel:
        """From the policy's weights in memory while they are the loaded ones and nothing
        transforms them on load (LoRA, dequantization), else from the checkpoint
        (``logprobs`` module docstring). Every rank decides alike: same recipe, same steps."""
        policy = self.recipe.policy
        if (
            self.policy_weights_initial
            and not policy.automodel_cfg.lora_cfg.enabled
            and not policy.dequantize_base_checkpoint
        ):
            reference = self._build_sharded(self.model_path, training=False, unloaded=True)
            if copy_policy_state(reference, self.model):
                self.reference_source = "policy"
                return reference
            del reference
        self.reference_source = "checkpoint"
        return self._build_sharded(self.model_path, training=False)

    # ------------------------------------------------------------------ weights out
    def export_hf_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Full weights with Hugging Face names on every rank (``checkpoint.full_hf_weights``)."""
        self._settle()
        return checkpoint.full_hf_weights(
            self.model, self.ep_mesh, self._lora_scale, self.model_path
        )

    @property
    def _lora_scale(self) -> float | None:
        """alpha / dim of the adapters the trained model carries; None: no LoRA."""
        lora = self.recipe.policy.automodel_cfg.lora_cfg
        return lora.scale if lora.enabled else None

    def _dp_rank(self) -> int:
        coords = self.mesh.get_coordinate()
        assert coords is not None
        replicate_index, shard_index, _, _ = coords
        return replicate_index * self.shape.dp_shard + shard_index

    # ------------------------------------------------------------------ memory
    def offload_optimizer(self) -> None:
        self._move_optimizer_state(torch.device("cpu"))

    def onload_optimizer(self) -> None:
        self._move_optimizer_state(self.device)

    def _move_optimizer_state(self, device: torch.device) -> None:
        self._settle()
        if self.device.type == "cpu" or self.recipe.policy.automodel_cfg.cpu_offload:
            return
        move_optimizer_state(self.optimizer, device)
        if device.type == "cpu":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self._settle()
        checkpoint.save(
            checkpoint_dir,
            self.model,
            self.optimizer,
            self.scheduler,
            self.step,
            adapters_only=self._lora_scale is not None,
        )

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self.policy_weights_initial = False
        self._settle()
        self.step = checkpoint.load(
            checkpoint_dir,
            self.model,
            self.optimizer,
            self.scheduler,
            adapters_only=self._lora_scale is not None,
        )

    def export_hf(self, out_dir: str) -> None:
        self._settle()
        tokenizer_path = self.recipe.policy.tokenizer.name or self.model_path
        checkpoint.export_hf(
            out_dir,
            self.model,
            self.model.hf.config,
            tokenizer_path,
            "hf.",
            lora_scale=self._lora_scale,
            gathered=dict(self.export_hf_weights()) if self.ep_mesh is not None else None,
        )

    def collect_state(self) -> dict[str, Any]:
        peak_gb = 0.0
        if self.device.type == "cuda":
            peak_gb = torch.cuda.max_memory_allocated() / 2**30
        return {
            "step": self.step,
            "peak_memory_gb": peak_gb,
            "dp_rank": self._dp_rank(),
            "compiled_graphs": compiled_graph_count(),
        }

    def take_pass_metrics(self) -> dict[str, float]:
        metrics = self.passes.take()
        if getattr(self, "adam_stream", None) is not None and "time_train_optimizer_s" in metrics:
            # the update ran on its own stream, after the pass's timing ended
            metrics["time_train_optimizer_s"] += self.adam_stream.take_update_seconds()
        return metrics

    def close(self) -> None:
        self._settle()
        for name in ("model", "reference", "optimizer", "scheduler", "cp_group", "mesh", "ep_mesh"):
            if hasattr(self, name):
                delattr(self, name)
        gc.collect()
