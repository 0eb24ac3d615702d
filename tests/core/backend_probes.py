"""Probes of the Automodel and Megatron backends' consumer sites (``consumer_probes``: what a
probe is): the optimizer, scheduler, clipping and parallelize steps the Automodel worker builds,
its LoRA adapters, and the Megatron provider, optimizer, scheduler, DDP, conversion and LoRA
settings, each from the recipe, on CPU.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch

from hpcrl.config.recipe import Recipe
from tests.core.recording_policy import plain


def automodel_optimizer_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.automodel.optim import build_lr_scheduler, build_optimizer

    assert recipe.policy.optimizer is not None
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.ones(4))
    optimizer = build_optimizer([param], recipe.policy.optimizer)
    scheduler = build_lr_scheduler(optimizer, recipe.policy.scheduler)
    trace = []
    for _ in range(6):
        optimizer.zero_grad()
        (param * torch.arange(4.0)).sum().backward()
        optimizer.step()
        scheduler.step()
        trace.append((optimizer.param_groups[0]["lr"], param.detach().clone()))
    hypers = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return {"type": type(optimizer).__name__, "hypers": plain(hypers), "trace": plain(trace)}


def automodel_training_optimizer_probe(recipe: Recipe, tmp: Path) -> Any:
    """The optimizer the Automodel worker builds (``build_training_optimizer`` with the
    worker's arguments) from the recipe the job reads: planned on the eos profile, its
    JobSpec written to a run folder and read back, as the node entrypoint does."""
    from hpcrl.config import load_profile
    from hpcrl.core.backends.automodel.optim import build_training_optimizer
    from hpcrl.plan.planner import plan
    from hpcrl.run.jobspec_file import read_jobspec, write_jobspec

    spec = plan(recipe, load_profile("eos"), run_dir=str(tmp / "run"), recipe_source="p.yaml")
    (tmp / "run").mkdir(exist_ok=True)
    write_jobspec(spec)
    job_recipe = read_jobspec(tmp / "run").recipe
    cfg = job_recipe.policy.automodel_cfg
    assert job_recipe.policy.optimizer is not None
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.ones(n)) for n in (4, 4)]
    optimizer = build_training_optimizer(
        params,
        job_recipe.policy.optimizer,
        on_gpu=False,
        cpu_offload=cfg.cpu_offload,
        offload_fraction=cfg.optimizer_offload_fraction,
    )
    on_host = [getattr(optimizer, "is_on_host", lambda p: False)(p) for p in params]
    return {"type": type(optimizer).__name__, "on_host": on_host}


def clip_probe(recipe: Recipe, tmp: Path) -> Any:
    """AutomodelWorker.train_step clips with ``clip_gradients(params, max_grad_norm)``; this
    replays that call on one parameter with a known gradient."""
    from hpcrl.core.backends.automodel.optim import clip_gradients

    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.full((4,), 3.0)
    clip_gradients([param], recipe.policy.max_grad_norm)
    return plain(param.grad)


def parallelize_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.automodel.parallelize import MeshShape, parallelize_steps

    cfg = recipe.policy.automodel_cfg
    shape = MeshShape.for_world(
        8, cfg.dp_replicate_size, cfg.tensor_parallel_size, cfg.context_parallel_size
    )
    return plain(
        parallelize_steps(
            cfg, recipe.policy.precision, shape, on_gpu=True, compiles=False, training=True
        )
    )


def megatron_provider_probe(recipe: Recipe, tmp: Path) -> Any:
    """The provider fields hpcrl sets (apply_megatron_cfg and model_overrides through
    prepare_provider) on a namespace standing in for megatron-bridge's provider, as on a
    machine with Transformer Engine (the TE-only flags are switched off without it)."""
    from unittest import mock

    from hpcrl.core.backends.megatron import provider as module

    target = types.SimpleNamespace(hidden_dropout=0.0, attention_dropout=0.0)
    with mock.patch.object(module, "transformer_engine_available", return_value=True):
        module.prepare_provider(
            target, recipe.policy.megatron_cfg, recipe.policy.precision, seq_length=128
        )
    return plain(target)


def megatron_optimizer_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.megatron.model import optimizer_config

    built = optimizer_config(recipe.policy.megatron_cfg, recipe.policy.precision)
    return plain(vars(built))


def precision_aware_probe(recipe: Recipe, tmp: Path) -> Any:
    """Whether megatron-core is asked for the precision-aware optimizer on a machine with
    Transformer Engine (megatron-core's OptimizerConfig refuses it without TE, as here)."""
    from hpcrl.core.backends.megatron.offload import precision_aware_optimizer_on

    optimizer = recipe.policy.megatron_cfg.optimizer
    requested = optimizer.use_precision_aware_optimizer
    return precision_aware_optimizer_on(requested, optimizer.optimizer_cpu_offload, True)


def megatron_scheduler_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.megatron.model import scheduler_settings

    return plain(scheduler_settings(recipe.policy.megatron_cfg, total_steps=100))


def megatron_ddp_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.megatron.model import ddp_config

    return plain(vars(ddp_config(recipe.policy.megatron_cfg)))


def conversion_probe(recipe: Recipe, tmp: Path) -> Any:
    """MegatronWorker._ensure_conversion calls ensure_megatron_checkpoint with
    ``force=megatron_cfg.force_reconvert_from_hf`` and ``policy.hf_config_overrides`` (a
    changed config is converted apart); this replays that call over a complete earlier
    conversion of the unchanged config and reports whether it converted again."""
    from hpcrl.core.backends.megatron.conversion import (
        COMPLETE_MARKER,
        ensure_megatron_checkpoint,
        model_key,
    )

    root = tmp / "conversions"
    done = root / model_key("m")
    done.mkdir(parents=True)
    (done / COMPLETE_MARKER).write_text("")
    converted: list[str] = []

    def convert(hf_path: str, out_dir: str) -> None:
        converted.append(hf_path)
        Path(out_dir).mkdir(parents=True, exist_ok=True)

    ensure_megatron_checkpoint(
        "m",
        "/hf/m",
        str(root),
        force=recipe.policy.megatron_cfg.force_reconvert_from_hf,
        convert=convert,
        rank=0,
        progress=lambda message: None,
        hf_config_overrides=recipe.policy.hf_config_overrides,
    )
    return converted


def lora_probe(recipe: Recipe, tmp: Path) -> Any:
    """``apply_lora`` with the recipe's ``lora_cfg`` on the tiny model (seeded): which
    linears got adapters, their shapes, scale, dropout and initial A; {} without LoRA."""
    from hpcrl.core.backends.automodel.lora import LoraLinear, apply_lora
    from hpcrl.core.backends.automodel.model import load_hf_model
    from hpcrl.core.models.tiny import ensure_tiny_model

    cfg = recipe.policy.automodel_cfg.lora_cfg
    if not cfg.enabled:
        return {}
    torch.manual_seed(0)
    model = load_hf_model(ensure_tiny_model("tiny:qwen2"), "cpu")
    apply_lora(model, cfg)
    return {
        name: {
            "a": list(module.lora_A.weight.shape),
            "b": list(module.lora_B.weight.shape),
            "scale": module.scale,
            "dropout": [module.dropout_p, module.dropout_position],
            "a_sum": round(float(module.lora_A.weight.detach().sum()), 4),
        }
        for name, module in model.named_modules()
        if isinstance(module, LoraLinear)
    }


def megatron_lora_probe(recipe: Recipe, tmp: Path) -> Any:
    """The megatron-bridge ``LoRA`` that ``lora_for`` builds from ``megatron_cfg.peft`` (the
    object that adapts the model): its settings; None without LoRA."""
    import dataclasses

    from hpcrl.core.backends.megatron.lora import lora_for

    lora = lora_for(recipe.policy.megatron_cfg.peft)
    if lora is None:
        return None
    names = ("target_modules", "exclude_modules", "dim", "alpha", "dropout", "dropout_position",
             "lora_A_init_method", "lora_B_init_method")  # fmt: skip
    fields = {f.name for f in dataclasses.fields(lora)}
    assert set(names) <= fields, sorted(fields)
    return {name: getattr(lora, name) for name in names}
