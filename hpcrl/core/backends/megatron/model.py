"""Parallel state, model, optimizer and LR/WD scheduler of the Megatron backend.

megatron-core objects are built from the recipe here and nowhere else: TP/PP/CP/EP from
``policy.megatron_cfg``, megatron DDP (``distributed_data_parallel_config``), the
(distributed) optimizer from ``megatron_cfg.optimizer`` and ``OptimizerParamScheduler`` from
``megatron_cfg.scheduler``. Grad clipping is the optimizer's (``clip_grad``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcrl.config.recipe import MegatronCfg


def initialize_parallel_state(cfg: MegatronCfg, seed: int) -> None:
    """Megatron's TP/PP/CP/EP/DP groups on top of the existing default process group."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
        context_parallel_size=cfg.context_parallel_size,
        expert_model_parallel_size=cfg.expert_model_parallel_size,
        expert_tensor_parallel_size=cfg.expert_tensor_parallel_size,
    )
    model_parallel_cuda_manual_seed(seed)


def ddp_config(cfg: MegatronCfg) -> Any:
    from megatron.core.distributed import DistributedDataParallelConfig

    ddp = cfg.distributed_data_parallel_config
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=ddp.grad_reduce_in_fp32,
        overlap_grad_reduce=ddp.overlap_grad_reduce,
        overlap_param_gather=ddp.overlap_param_gather,
        average_in_collective=ddp.average_in_collective,
        data_parallel_sharding_strategy=ddp.data_parallel_sharding_strategy,
        use_distributed_optimizer=cfg.optimizer.use_distributed_optimizer,
    )


def build_model(provider: Any, cfg: MegatronCfg, on_cpu: bool) -> list:
    """Model chunks (one per virtual pipeline stage) wrapped in megatron-core DDP.

    The DDP wrap is done here rather than by the bridge: the bridge's wrap runs on a CUDA
    side stream (for full-iteration CUDA graphs), which also ties it to one bridge version.
    """
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.utils import get_model_config

    if cfg.distributed_data_parallel_config.use_custom_fsdp:
        raise ValueError(
            "policy.megatron_cfg.distributed_data_parallel_config.use_custom_fsdp=true: Megatron "
            "FSDP is not supported by hpcrl's Megatron backend yet; use the distributed optimizer"
        )
    if cfg.peft.enabled:
        from hpcrl.core.backends.megatron.lora import lora_pre_wrap_hook

        # registered (not passed): a hook passed to provide_distributed_model replaces the
        # provider's own ones, such as the bridge's loading of HF weights
        provider.register_pre_wrap_hook(lora_pre_wrap_hook(cfg.peft))
    chunks = provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=on_cpu, data_parallel_random_init=False
    )
    ddp = ddp_config(cfg)
    return [
        DistributedDataParallel(
            config=get_model_config(chunk),
            ddp_config=ddp,
            module=chunk,
            disable_bucketing=index > 0,
        )
        for index, chunk in enumerate(chunks)
    ]


def optimizer_config(cfg: MegatronCfg, precision: str) -> Any:
    """megatron-core OptimizerConfig from ``megatron_cfg.optimizer`` (offload fields included)."""
    import torch
    from megatron.core.optimizer import OptimizerConfig

    from hpcrl.core.backends.megatron.offload import precision_aware_optimizer_on, te_available

    opt = cfg.optimizer
    return OptimizerConfig(
        optimizer=opt.optimizer,
        lr=opt.lr,
        min_lr=opt.min_lr,
        weight_decay=opt.weight_decay,
        bf16=precision == "bfloat16" or opt.bf16,
        fp16=precision == "float16" or opt.fp16,
        params_dtype=getattr(torch, opt.params_dtype),
        adam_beta1=opt.adam_beta1,
        adam_beta2=opt.adam_beta2,
        adam_eps=opt.adam_eps,
        sgd_momentum=opt.sgd_momentum,
        use_distributed_optimizer=opt.use_distributed_optimizer,
        use_precision_aware_optimizer=precision_aware_optimizer_on(
            opt.use_precision_aware_optimizer, opt.optimizer_cpu_offload, te_available()
        ),
        clip_grad=opt.clip_grad,
        optimizer_cpu_offload=opt.optimizer_cpu_offload,
        optimizer_offload_fraction=opt.optimizer_offload_fraction,
        overlap_cpu_optimizer_d2h_h2d=opt.overlap_cpu_optimizer_d2h_h2d,
    )


def build_optimizer(model_chunks: list, cfg: MegatronCfg, precision: str) -> Any:
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(optimizer_config(cfg, precision), model_chunks)


def build_scheduler(optimizer: Any, cfg: MegatronCfg, total_steps: int) -> Any:
    """LR/WD schedule stepped once per optimizer step (``megatron_cfg.scheduler``)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(optimizer, **scheduler_settings(cfg, total_steps))


def scheduler_settings(cfg: MegatronCfg, total_steps: int) -> dict[str, Any]:
    """``OptimizerParamScheduler``'s arguments from ``megatron_cfg.scheduler`` and the LR
    bounds of ``megatron_cfg.optimizer``; decay over the run unless lr_decay_iters says."""
    sched = cfg.scheduler
    decay_steps = sched.lr_decay_iters or max(total_steps, sched.lr_warmup_iters + 1)
    return {
        "init_lr": sched.lr_warmup_init,
        "max_lr": cfg.optimizer.lr,
        "min_lr": cfg.optimizer.min_lr,
        "lr_warmup_steps": sched.lr_warmup_iters,
        "lr_decay_steps": decay_steps,
        "lr_decay_style": sched.lr_decay_style,
        "start_wd": sched.start_weight_decay,
        "end_wd": sched.end_weight_decay,
        "wd_incr_steps": decay_steps,
        "wd_incr_style": sched.weight_decay_incr_style,
    }


def connect_grad_sync(model_chunks: list, optimizer: Any) -> None:
    """Hook DDP's gradient reduction and the loss scale into the pipeline schedules.

    Without ``finalize_model_grads_func`` the schedules never reduce gradients across
    data-parallel ranks (nor tied embeddings across pipeline stages): every rank would step
    on its own shard's gradients.
    """
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config

    config = get_model_config(model_chunks[0])
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    no_sync = [chunk.no_sync for chunk in model_chunks]
    config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
