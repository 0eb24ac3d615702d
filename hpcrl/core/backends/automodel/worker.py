"""``AutomodelWorker``: one rank of the Automodel backend (HF model + FSDP2 / HSDP / TP).

Implements ``hpcrl.core.backends.base.BackendWorker``; the process group exists before
``setup`` (the actor creates it).
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hpcrl.core.backends.automodel import checkpoint
from hpcrl.core.backends.automodel.model import HfCallable, TokenLogprobModel, load_hf_model
from hpcrl.core.backends.automodel.optim import build_lr_scheduler, build_optimizer, clip_gradients
from hpcrl.core.backends.automodel.parallelize import (
    MeshShape,
    apply_activation_checkpointing,
    apply_autocast,
    apply_compile,
    apply_fsdp,
    apply_tp,
    build_mesh,
    data_parallel_mesh,
    needs_fsdp,
)
from hpcrl.core.backends.base import DataParallelPlace, RankInfo
from hpcrl.core.policy import UNFILTERED_LOGPROBS_KEY
from hpcrl.core.token_distribution import TokenDistribution, training_distribution
from hpcrl.core.workers.micro_batches import (
    MicroBatchSpec,
    logprob_micro_batches,
    scatter_rows,
    unpack_logprobs,
)

if TYPE_CHECKING:
    from hpcrl.config.recipe import GenerationCfg, Recipe
    from hpcrl.core.policy import Batch, LossFn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_supported(recipe: Recipe, device: str) -> None:
    cfg = recipe.policy.automodel_cfg
    if cfg.cpu_offload and device != "cuda":
        raise ValueError(
            "policy.automodel_cfg.cpu_offload: true needs GPU workers (it keeps parameters in "
            "host memory between GPU steps); set it to false on CPU profiles"
        )
    if cfg.context_parallel_size != 1:
        raise ValueError(
            "policy.automodel_cfg.context_parallel_size: the automodel backend has no context "
            f"parallelism yet (got {cfg.context_parallel_size}); set it to 1"
        )
    if cfg.sequence_parallel:
        raise ValueError(
            "policy.automodel_cfg.sequence_parallel: not supported by the automodel backend "
            "yet; set it to false"
        )


def _seed_everything(recipe: Recipe, rank: int) -> None:
    """Same recipe, same numbers: every rank's RNG streams start from the algorithm seed."""
    import random

    algorithm_cfg = recipe.grpo if recipe.grpo is not None else recipe.sft
    seed = (algorithm_cfg.seed if algorithm_cfg is not None else 0) * 1_000 + rank
    random.seed(seed)
    torch.manual_seed(seed)


def forward_logprobs(
    model: TokenLogprobModel, micro: Batch, distribution: TokenDistribution | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) token log-probs [rows, width] of one micro-batch; a pack runs
    as one row whose positions restart per sequence, then is unpacked to the rows the loss
    expects."""
    if "packed_input_ids" not in micro:
        return model(micro["input_ids"], micro["attention_mask"], distribution=distribution)
    processed, unfiltered = model(
        micro["packed_input_ids"],
        None,
        position_ids=micro["packed_position_ids"],
        distribution=distribution,
    )
    return unpack_logprobs(processed, micro), unpack_logprobs(unfiltered, micro)


class AutomodelWorker:
    """Model, reference model, optimizer and scheduler of one rank."""

    def setup(self, recipe: Recipe, rank_info: RankInfo, model_path: str) -> DataParallelPlace:
        _check_supported(recipe, rank_info.device)
        _seed_everything(recipe, rank_info.rank)
        self.recipe = recipe
        self.rank_info = rank_info
        self.model_path = model_path
        self.device = torch.device("cuda" if rank_info.device == "cuda" else "cpu")
        self.distribution = training_distribution(recipe)
        cfg = recipe.policy.automodel_cfg
        self.shape = MeshShape.for_world(
            rank_info.world_size, cfg.dp_replicate_size, cfg.tensor_parallel_size
        )
        self.mesh = build_mesh(rank_info.device, self.shape)
        self.model = self._build_sharded(model_path, training=True)
        assert recipe.policy.optimizer is not None, "the config rules require one on Automodel"
        self.optimizer = build_optimizer(
            self.model.parameters(),
            recipe.policy.optimizer,
            # With CPU offload the optimizer steps on host-side parameters.
            fused=self.device.type == "cuda" and not cfg.cpu_offload,
        )
        self.scheduler = build_lr_scheduler(self.optimizer, recipe.policy.scheduler)
        self.reference: TokenLogprobModel | None = None
        self.step = 0
        coords = self.mesh.get_coordinate()
        assert coords is not None
        replicate_index, shard_index, tp_index = coords
        return DataParallelPlace(
            dp_rank=replicate_index * self.shape.dp_shard + shard_index,
            dp_size=self.shape.dp_size,
            returns_results=tp_index == 0,
        )

    def _build_sharded(self, model_path: str, *, training: bool) -> TokenLogprobModel:
        """Load, then parallelize in torchtitan's order: TP → AC → compile → FSDP."""
        cfg = self.recipe.policy.automodel_cfg
        hf_model = load_hf_model(model_path, self.rank_info.device)
        if self.shape.tp > 1:
            apply_tp(hf_model, self.mesh["tp"])
        if training and cfg.activation_checkpointing:
            apply_activation_checkpointing(hf_model)
        if self.device.type == "cuda" and cfg.torch_compile:
            apply_compile(hf_model)
        root = TokenLogprobModel(hf_model)
        param_dtype = None
        if self.device.type == "cuda":
            param_dtype = DTYPES[self.recipe.policy.precision]
        if needs_fsdp(self.shape, cfg.cpu_offload):
            apply_fsdp(
                root,
                hf_model,
                data_parallel_mesh(self.mesh, self.shape),
                param_dtype=param_dtype,
                cpu_offload=cfg.cpu_offload,
            )
        else:
            apply_autocast(root, param_dtype)
        if not training:
            root.requires_grad_(False)
        return root

    # ------------------------------------------------------------------ training
    def _to_device(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {key: value.to(self.device, non_blocking=True) for key, value in batch.items()}

    def train_step(
        self, micro_batches: Sequence[Batch], loss_fn: LossFn, num_global_tokens: float
    ) -> dict[str, float]:
        self.model.train()
        totals: dict[str, float] = {"loss": 0.0}
        for micro in micro_batches:
            micro = self._to_device(micro)
            logprobs, unfiltered = forward_logprobs(self.model, micro, self.distribution)
            if self.distribution.filters:
                micro[UNFILTERED_LOGPROBS_KEY] = unfiltered
            loss, metrics = loss_fn(logprobs, micro, num_global_tokens)
            # FSDP averages gradients over data-parallel ranks; the loss is a share of a
            # global sum, so scale back up to get the gradient of that sum.
            (loss * self.shape.dp_size).backward()
            totals["loss"] += float(loss.detach())
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = clip_gradients(params, self.recipe.policy.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        summed = self._sum_over_data_parallel(totals)
        return {**summed, "grad_norm": norm, "lr": lr}

    def _sum_over_data_parallel(self, values: Mapping[str, float]) -> dict[str, float]:
        keys = sorted(values)
        packed = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(packed)
        packed /= self.shape.tp  # TP peers hold the same numbers
        return dict(zip(keys, packed.tolist(), strict=True))

    # ------------------------------------------------------------------ log-probs
    @torch.no_grad()
    def _logprobs_with(
        self,
        model: TokenLogprobModel,
        batch: Batch,
        distribution: TokenDistribution,
        plan: Sequence[MicroBatchSpec] | None,
    ) -> torch.Tensor:
        specs, micro_batches = logprob_micro_batches(batch, plan, self.recipe)
        pieces = [
            forward_logprobs(model, self._to_device(micro), distribution)[0].float().cpu()
            for micro in micro_batches
        ]
        return scatter_rows(pieces, specs, *batch["input_ids"].shape)

    def logprobs(self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None) -> torch.Tensor:
        return self._logprobs_with(self.model, batch, self.distribution, plan)

    def reference_logprobs(
        self, batch: Batch, plan: Sequence[MicroBatchSpec] | None = None
    ) -> torch.Tensor:
        if self.reference is None:
            # Built on first use (all ranks call together): SFT never pays for it.
            self.reference = self._build_sharded(self.model_path, training=False)
        return self._logprobs_with(self.reference, batch, self.distribution.without_filters(), plan)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], cfg: GenerationCfg, seed: int
    ) -> dict[str, torch.Tensor]:
        from hpcrl.core.generation.torch_sampler import generate, pad_prompts

        hf_config = self.model.hf.config
        eos = hf_config.eos_token_id
        eos = eos[0] if isinstance(eos, list) else eos
        pad = hf_config.pad_token_id if hf_config.pad_token_id is not None else (eos or 0)
        input_ids, attention_mask = pad_prompts(prompt_ids, pad)
        self.model.eval()
        # Decode shapes change every step: compiled blocks would recompile; run them eager.
        try:
            with torch.compiler.set_stance("force_eager"):
                return generate(
                    HfCallable(self.model),
                    input_ids,
                    attention_mask,
                    cfg,
                    # TP peers of one data-parallel shard must draw the same tokens.
                    seed=seed * 1_000_003 + self._dp_rank(),
                    eos_token_id=eos,
                    pad_token_id=pad,
                    sync_group=dist.group.WORLD if dist.get_world_size() > 1 else None,
                    tokenizer=self._tokenizer() if cfg.stop_strings else None,
                )
        finally:
            self.model.train()

    def _tokenizer(self) -> Any:
        from hpcrl.core.models.tokenizer import load_tokenizer

        if getattr(self, "tokenizer", None) is None:
            self.tokenizer = load_tokenizer(self.recipe.policy.tokenizer.name or self.model_path)
        return self.tokenizer

    def _dp_rank(self) -> int:
        replicate_index, shard_index, _ = self.mesh.get_coordinate()
        return replicate_index * self.shape.dp_shard + shard_index

    # ------------------------------------------------------------------ memory
    def offload_optimizer(self) -> None:
        self._move_optimizer_state(torch.device("cpu"))

    def onload_optimizer(self) -> None:
        self._move_optimizer_state(self.device)

    def _move_optimizer_state(self, device: torch.device) -> None:
        if self.device.type == "cpu" or self.recipe.policy.automodel_cfg.cpu_offload:
            return
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        checkpoint.save(checkpoint_dir, self.model, self.optimizer, self.scheduler, self.step)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self.step = checkpoint.load(checkpoint_dir, self.model, self.optimizer, self.scheduler)

    def export_hf(self, out_dir: str) -> None:
        tokenizer_path = self.recipe.policy.tokenizer.name or self.model_path
        checkpoint.export_hf(out_dir, self.model, self.model.hf.config, tokenizer_path, "hf.")

    def collect_state(self) -> dict[str, Any]:
        peak_gb = 0.0
        if self.device.type == "cuda":
            peak_gb = torch.cuda.max_memory_allocated() / 2**30
        return {"step": self.step, "peak_memory_gb": peak_gb, "dp_rank": self._dp_rank()}

    def close(self) -> None:
        for name in ("model", "reference", "optimizer", "scheduler", "mesh"):
            if hasattr(self, name):
                delattr(self, name)
        gc.collect()
