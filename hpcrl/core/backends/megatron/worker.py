"""``MegatronWorker``: one rank of the Megatron backend (``hpcrl.core.backends.base``).

Setup order (the contract's): on a CPU job, the CPU compatibility layer entered (it is left
in ``close``; ``cpu_compat.py``) → env_vars exported → Transformer-Engine-only settings refused
where TE is absent → parallel state → a model whose logit post-processing the log-prob path
lacks refused → one-time HF→Megatron conversion (rank 0; the others wait) → provider with
recipe fields and ``model_overrides`` → model (megatron DDP) → weights loaded from the
conversion (parallel reads if asked) → optimizer and scheduler.
Manual GC is not the backend's: the hosting ``TrainingWorker`` switches it on after this
setup and collects after optimizer steps (``hpcrl.core.workers.manual_gc``), as for every
backend; a second owner here collected twice at every due step.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hpcrl.core.backends.base import DataParallelPlace, RankInfo
from hpcrl.core.backends.megatron import hf_import, offload, step
from hpcrl.core.backends.megatron import model as mcore_model
from hpcrl.core.backends.pass_stats import PassRecorder, TrainSplit
from hpcrl.core.token_distribution import (
    TokenDistribution,
    training_distribution,
)
from hpcrl.core.workers.device_upload import PinnedStaging
from hpcrl.core.workers.micro_batches import (
    BatchingSettings,
    MicroBatchSpec,
    logprob_micro_batches,
    scatter_rows,
)
from hpcrl.core.workers.sharding import pad_sequence_dim

if TYPE_CHECKING:
    from hpcrl.config.recipe import Recipe
    from hpcrl.core.policy import Batch, LossFn


def total_train_steps(recipe: Recipe) -> int:
    section = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert section is not None  # the config rules require one algorithm section
    return max(int(section.max_num_steps), 1)


class MegatronWorker:
    """One rank of the Megatron backend; every method is called on all ranks together."""

    # Every unpacked micro-batch's sequence dim is padded up to a multiple of this (and of
    # the recipe's own multiple): GRPO's widths change every step, and on a GPU each new
    # width is a new shape for the attention kernels to plan for (the Automodel worker's
    # compiled passes use the same bucket). Padding comes after every real token with a
    # token mask of 0: no loss or log-prob changes. None: 64 on a GPU, 1 (the widths as
    # planned) on the CPU, where a shape costs nothing new.
    sequence_bucket: int | None = None

    def setup(self, recipe: Recipe, rank_info: RankInfo, model_path: str) -> DataParallelPlace:
        from megatron.core import parallel_state as ps

        self.recipe, self.rank_info, self.model_path = recipe, rank_info, model_path
        self._cpu_compat = _enter_cpu_compat(rank_info.device)
        self.distribution = training_distribution(recipe)
        cfg = self.cfg = recipe.policy.megatron_cfg
        os.environ.update(cfg.env_vars)
        mcore_model.initialize_parallel_state(cfg, seed=self._seed())
        self.model_chunks = self._load_model()
        self._say_precision_aware_optimizer_is_off(cfg)
        self.optimizer = mcore_model.build_optimizer(
            self.model_chunks, cfg, recipe.policy.precision
        )
        mcore_model.connect_grad_sync(self.model_chunks, self.optimizer)
        self.scheduler = mcore_model.build_scheduler(self.optimizer, cfg, total_train_steps(recipe))
        self._reference_weights = self._snapshot_weights()
        self.device = torch.device("cuda" if rank_info.device == "cuda" else "cpu")
        self.staging = PinnedStaging()
        self.passes = PassRecorder(self.device)
        self.steps_done = 0
        _, reporter = step._result_rank_flags()
        return DataParallelPlace(
            dp_rank=ps.get_data_parallel_rank(),
            dp_size=ps.get_data_parallel_world_size(),
            returns_results=reporter,
        )

    def _say_precision_aware_optimizer_is_off(self, cfg: Any) -> None:
        requested = cfg.optimizer.use_precision_aware_optimizer
        if requested and self.rank_info.rank == 0:
            offloaded = cfg.optimizer.optimizer_cpu_offload
            if not offload.precision_aware_optimizer_on(True, offloaded, offload.te_available()):
                print(
                    "hpcrl: Transformer Engine is not installed and optimizer_cpu_offload is "
                    "off: policy.megatron_cfg.optimizer.use_precision_aware_optimizer is "
                    "switched off (fp32 master weights and moments either way)",
                    file=sys.stderr,
                    flush=True,
                )

    @property
    def skips_generic_optimizer_offload(self) -> bool:
        """With optimizer_cpu_offload megatron-core owns optimizer placement: the training core
        must not move optimizer state between phases."""
        return self.cfg.optimizer.optimizer_cpu_offload

    def _on_device(self, micro_batches: Sequence[Batch]) -> list[dict[str, torch.Tensor]]:
        """The micro-batches on the device in one copy, unpacked ones padded to the bucket."""
        bucket = self.sequence_bucket or (64 if self.device.type == "cuda" else 1)
        if bucket > 1:
            divisible_by = BatchingSettings.from_recipe(self.recipe, "train").divisible_by
            multiple = math.lcm(bucket, divisible_by)
            micro_batches = [
                m if "packed_input_ids" in m else pad_sequence_dim(m, multiple)
                for m in micro_batches
            ]
        return self.staging.upload(micro_batches, self.device)

    def _seed(self) -> int:
        section = self.recipe.grpo if self.recipe.grpo is not None else self.recipe.sft
        assert section is not None
        return int(section.seed)

    def _load_model(self) -> list:
        """The model chunks with ``model_path``'s weights, converted from HF once (a model
        whose logits the log-prob path cannot reproduce was refused before the workers:
        ``hpcrl.config.architectures``). The one step of setup that
        benchmarks/train_throughput_megatron.py replaces (random weights the raw megatron-core
        loop shares, no HF checkpoint); everything else it runs as a job does."""
        return self._build_model(self._ensure_conversion())

    def _ensure_conversion(self) -> Path:
        from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint

        root = self.rank_info.megatron_checkpoint_dir
        # The planner resolves it for every Megatron recipe; the driver passes it on.
        assert root is not None, "RankInfo.megatron_checkpoint_dir is unset (no plan?)"
        hf_overrides = self.recipe.policy.hf_config_overrides
        convert = hf_import.make_converter(
            self.cfg.model_overrides,
            prepare=_converter_prepare(self.rank_info.device),
            hf_config_overrides=hf_overrides,
        )
        return ensure_megatron_checkpoint(
            self.recipe.policy.model_name,
            self.model_path,
            root,
            force=self.cfg.force_reconvert_from_hf,
            convert=convert,
            rank=self.rank_info.rank,
            hf_config_overrides=hf_overrides,
        )

    def _build_model(self, conversion_dir: Path) -> list:
        from hpcrl.core.backends.megatron.parallel_read import parallel_reads
        from hpcrl.core.backends.megatron.provider import prepare_provider

        policy = self.recipe.policy
        provider = hf_import.build_provider(
            self.model_path, load_weights=False, hf_config_overrides=policy.hf_config_overrides
        )
        turned_off = prepare_provider(
            provider, self.cfg, policy.precision, policy.max_total_sequence_length
        )
        if turned_off and self.rank_info.rank == 0:
            # The recipe asked for them; without TE they would fail finalize(). Say so once.
            print(
                "hpcrl: Transformer Engine is not installed: building megatron-core's local "
                f"layer spec and switching off {', '.join(sorted(turned_off))}",
                file=sys.stderr,
                flush=True,
            )
        provider.finalize()
        self.provider = provider
        chunks = mcore_model.build_model(provider, self.cfg, on_cpu=self.rank_info.device == "cpu")
        with parallel_reads(self.cfg.checkpoint.parallel_read_threads):
            hf_import.load_weights(chunks, conversion_dir / hf_import.WEIGHTS_SUBDIR)
        if self.cfg.peft.enabled and self.rank_info.rank == 0:
            from hpcrl.core.backends.megatron.lora import lora_summary

            print(lora_summary(chunks), file=sys.stderr, flush=True)
        return chunks

    # ------------------------------------------------------------------ weights
    def _parameters(self) -> list[torch.nn.Parameter]:
        return [p for chunk in self.model_chunks for p in chunk.parameters()]

    def _snapshot_weights(self) -> list[torch.Tensor]:
        """A copy of the weights for the reference log-probs: on the GPU beside the model
        (one bf16 copy: a swap costs milliseconds), or in pinned host memory where the
        recipe moves optimizer state off the GPU to save its memory."""
        on_host = self.rank_info.device == "cpu" or self.cfg.optimizer.optimizer_cpu_offload
        pin = on_host and self.rank_info.device == "cuda"
        copies = []
        for param in self._parameters():
            if on_host:
                copy = torch.empty(param.shape, dtype=param.dtype, pin_memory=pin)
                copy.copy_(param.detach())
            else:
                copy = param.detach().clone()
            copies.append(copy)
        return copies

    @torch.no_grad()
    def _swap_with_reference(self) -> None:
        """Exchange the live weights and the reference copy, tensor by tensor (one
        parameter's worth of scratch memory): called twice, everything is back in place,
        bit for bit."""
        for param, stored in zip(self._parameters(), self._reference_weights, strict=True):
            scratch = param.detach().clone()
            param.copy_(stored, non_blocking=True)
            stored.copy_(scratch, non_blocking=True)

    # ------------------------------------------------------------------ training
    def train_step(
        self, micro_batches: Sequence[Batch], loss_fn: LossFn, num_global_tokens: float
    ) -> dict[str, float]:
        real_tokens = sum(int(m["attention_mask"].sum()) for m in micro_batches)
        with self.passes.measure("train", real_tokens) as stats:
            split = TrainSplit(self.device)
            on_device = self._on_device(micro_batches)
            for micro in on_device:  # as the forward gets them: the bucket's padding counts
                stats.add_micro_batch(micro)
            lr = self.optimizer.param_groups[0]["lr"]
            self.optimizer.zero_grad()
            metrics = step.run_train_microbatches(
                self.model_chunks,
                on_device,
                loss_fn,
                num_global_tokens,
                self.distribution,
            )
            split.backward_done()
            update_successful, grad_norm, _zeros = self.optimizer.step()
            assert update_successful, "optimizer step skipped (fp16 loss-scale overflow)"
            self.scheduler.step(increment=1)
            self.steps_done += 1
            grad_norm = float(grad_norm)
            split.finish(stats)
        return {**metrics, "grad_norm": grad_norm, "lr": float(lr)}

    def logprobs(self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None) -> torch.Tensor:
        return self._logprobs_under("logprobs", batch, self.distribution, plan)

    def _logprobs_under(
        self,
        kind: str,
        batch: Batch,
        distribution: TokenDistribution,
        plan: Sequence[MicroBatchSpec] | None,
    ) -> torch.Tensor:
        specs, micro_batches = logprob_micro_batches(batch, plan, self.recipe)
        with self.passes.measure(kind, int(batch["attention_mask"].sum())) as stats:
            on_device = self._on_device(micro_batches)
            for micro in on_device:
                stats.add_micro_batch(micro)
            pieces = step.compute_logprobs(self.model_chunks, on_device, distribution)
            if pieces is None:  # not the reporting rank: the controller ignores this output
                return torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
            # assembled where the pieces are, read back once
            return scatter_rows(pieces, specs, *batch["input_ids"].shape).cpu()

    def reference_logprobs(
        self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None
    ) -> torch.Tensor:
        self._swap_with_reference()
        try:
            # NeMo RL scores the reference with the temperature but no top-k/top-p.
            return self._logprobs_under(
                "reference", batch, self.distribution.without_filters(), plan
            )
        finally:
            self._swap_with_reference()

    # ------------------------------------------------------------------ weights out
    def export_hf_weights(self) -> list[tuple[str, torch.Tensor]]:
        """With the whole model on this rank: views of the live parameters on the device (no
        gather, no host round trip: ``direct_export``); otherwise megatron-bridge's export."""
        from hpcrl.core.backends.megatron import direct_export
        from hpcrl.core.backends.megatron.generation import export_hf_weights

        # direct_export maps base parameter names only; the bridge merges LoRA adapters
        if direct_export.applies() and not self.cfg.peft.enabled:
            direct = direct_export.direct_hf_weights(self.model_chunks, self.provider)
            if direct is not None:
                return direct
        return export_hf_weights(self._hf_bridge(), self.model_chunks)

    def _hf_bridge(self) -> Any:
        if getattr(self, "_bridge", None) is None:
            from hpcrl.core.backends.megatron.generation import build_bridge

            self._bridge = build_bridge(self.model_path, self.recipe.policy.hf_config_overrides)
        return self._bridge

    # ------------------------------------------------------------------ optimizer placement
    def offload_optimizer(self) -> None:
        """Optimizer state to host before generation, unless megatron owns placement
        (optimizer_cpu_offload) or everything is on the host already (CPU)."""
        if not self._generic_optimizer_move_applies():
            return
        self.optimizer.offload_to_cpu()

    def onload_optimizer(self) -> None:
        """Undo ``offload_optimizer``."""
        if not self._generic_optimizer_move_applies():
            return
        self.optimizer.restore_from_cpu()

    def _generic_optimizer_move_applies(self) -> bool:
        return not self.skips_generic_optimizer_offload and self.rank_info.device != "cpu"

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        from hpcrl.core.backends.megatron.checkpoint import save_training_state

        save_training_state(self, checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        from hpcrl.core.backends.megatron.checkpoint import load_training_state

        load_training_state(self, checkpoint_dir)

    def export_hf(self, out_dir: str) -> None:
        from hpcrl.core.backends.megatron.bridge_compat import save_hf_pretrained

        save_hf_pretrained(self._hf_bridge(), self.model_chunks, out_dir)

    def take_pass_metrics(self) -> Mapping[str, float]:
        return self.passes.take()

    def collect_state(self) -> Mapping[str, Any]:
        peak_gb = 0.0
        if self.rank_info.device == "cuda":
            peak_gb = torch.cuda.max_memory_allocated() / 2**30
        return {
            # The contract's name: the hosting TrainingWorker resumes its step count from it.
            "step": self.steps_done,
            "peak_memory_gb": peak_gb,
        }

    def close(self) -> None:
        from megatron.core import parallel_state

        from hpcrl.core.backends.megatron.checkpoint import release_writer_results_queue

        del self.model_chunks, self.optimizer, self.scheduler, self._reference_weights
        self._bridge = None
        parallel_state.destroy_model_parallel()
        release_writer_results_queue()
        self._cpu_compat.close()  # last: the teardown above still runs megatron-core code


def _enter_cpu_compat(device: str) -> contextlib.ExitStack:
    """The CPU compatibility layer for this worker's life when the plan's device is CPU
    (megatron-core hard-codes CUDA in a few places); nothing on GPUs. ``close`` leaves it."""
    stack = contextlib.ExitStack()
    if device == "cpu":
        from hpcrl.core.backends.megatron.bridge_compat import import_bridge
        from hpcrl.core.backends.megatron.cpu_compat import cpu_compat

        import_bridge()
        stack.enter_context(cpu_compat())
    return stack


def _converter_prepare(device: str) -> Callable[[], None] | None:
    """What the spawned HF→Megatron converter runs first: the CPU layer on a CPU job."""
    if device != "cpu":
        return None
    from hpcrl.core.backends.megatron.cpu_compat import apply_for_process

    return apply_for_process
