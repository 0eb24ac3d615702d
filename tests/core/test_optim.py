"""The Automodel backend builds NeMo RL's optimizer and scheduler forms into the torch objects
NeMo RL would build: the learning rate of every optimizer step equals the closed form."""

import math

import pytest
import torch

from hpcrl.config.recipe import LrSchedulerCfg, OptimizerCfg
from hpcrl.core.backends.automodel.optim import build_lr_scheduler, build_optimizer
from tests.recipe_builder import TE_FUSED_ADAM

LR = 0.2


def lrs_over(entries, steps, optimizer_cfg=None):
    params = [torch.nn.Parameter(torch.ones(3))]
    cfg = optimizer_cfg or OptimizerCfg(name="torch.optim.AdamW", kwargs={"lr": LR})
    optimizer = build_optimizer(params, cfg)
    scheduler = build_lr_scheduler(optimizer, entries)
    seen = []
    for _ in range(steps):
        seen.append(scheduler.get_last_lr()[0])
        params[0].grad = torch.ones(3)
        optimizer.step()
        scheduler.step()
    return optimizer, seen


def test_linear_warmup_then_constant_as_nemo_rl_writes_it():
    entries = (
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.LinearLR",
            kwargs={"start_factor": 0.1, "end_factor": 1.0, "total_iters": 4},
        ),
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.ConstantLR",
            kwargs={"factor": 1.0, "total_iters": 10000000000},
        ),
        LrSchedulerCfg(milestones=(4,)),
    )
    _, seen = lrs_over(entries, 8)
    expected = [LR * (0.1 + 0.9 * k / 4) for k in range(4)] + [LR] * 4
    assert seen == pytest.approx(expected, rel=1e-12)


def test_warmup_then_cosine_decay():
    entries = (
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.LinearLR",
            kwargs={"start_factor": 0.5, "end_factor": 1.0, "total_iters": 2},
        ),
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.CosineAnnealingLR", kwargs={"T_max": 4, "eta_min": 0.0}
        ),
        LrSchedulerCfg(milestones=(2,)),
    )
    _, seen = lrs_over(entries, 6)
    cosine = [0.5 * LR * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert seen == pytest.approx([0.5 * LR, 0.75 * LR, *cosine], rel=1e-9)


def test_no_scheduler_keeps_the_rate():
    _, seen = lrs_over(None, 3)
    assert seen == [LR, LR, LR]


def test_optimizer_class_and_kwargs_reach_torch():
    sgd = OptimizerCfg(
        name="torch.optim.SGD", kwargs={"lr": 0.5, "momentum": 0.9, "nesterov": True}
    )
    optimizer, _ = lrs_over(None, 1, sgd)
    assert type(optimizer) is torch.optim.SGD
    group = optimizer.param_groups[0]
    assert (group["momentum"], group["nesterov"]) == (0.9, True)
    adamw = OptimizerCfg(
        name="torch.optim.AdamW", kwargs={"lr": 1e-3, "betas": [0.8, 0.9], "foreach": False}
    )
    optimizer, _ = lrs_over(None, 1, adamw)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.9)
    assert optimizer.param_groups[0]["foreach"] is False


class _StandInFusedAdam(torch.optim.AdamW):
    """Stand-in for Transformer Engine's FusedAdam, which installs and runs only with CUDA
    (not on this machine): an AdamW that keeps the arguments the TE class takes."""

    def __init__(self, params, lr, master_weights=False, exp_avg_dtype=torch.float32, **rest):
        self.received = {"lr": lr, "master_weights": master_weights, "exp_avg_dtype": exp_avg_dtype}
        self.received.update(rest)
        super().__init__(params, lr=lr, weight_decay=rest.get("weight_decay", 0.01))


def test_te_fused_adam_is_built_with_nemo_rl_kwargs_and_dtypes(monkeypatch):
    """NeMo RL's gemma4 DAPO recipes name TE's FusedAdam with bf16 state and fp32 master
    weights: hpcrl builds that class with those arguments, the dtype strings as torch dtypes,
    and without the torch-only ``fused`` flag it adds on the GPU for torch's Adam."""
    import sys
    import types

    module = types.ModuleType("transformer_engine.pytorch.optimizers.fused_adam")
    module.FusedAdam = _StandInFusedAdam
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.optimizers.fused_adam", module)
    kwargs = TE_FUSED_ADAM["kwargs"]
    cfg = OptimizerCfg(name=TE_FUSED_ADAM["name"], kwargs=kwargs)
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    optimizer = build_optimizer([torch.nn.Parameter(torch.ones(3)), frozen], cfg, fused=True)
    assert type(optimizer) is _StandInFusedAdam
    assert optimizer.received == {
        **kwargs,
        "exp_avg_dtype": torch.bfloat16,
        "exp_avg_sq_dtype": torch.bfloat16,
    }
    assert [p.shape for p in optimizer.param_groups[0]["params"]] == [(3,)]  # trainable only


def test_te_fused_adam_without_transformer_engine_names_the_key(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    cfg = OptimizerCfg(
        name="transformer_engine.pytorch.optimizers.fused_adam.FusedAdam", kwargs={"lr": 1.0}
    )
    with pytest.raises(ValueError, match="policy.optimizer.name: .*Transformer Engine"):
        build_optimizer([torch.nn.Parameter(torch.ones(3))], cfg)
