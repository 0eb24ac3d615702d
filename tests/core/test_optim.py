"""The Automodel backend builds NeMo RL's optimizer and scheduler forms into the torch objects
NeMo RL would build: the learning rate of every optimizer step equals the closed form."""

import math

import pytest
import torch

from hpcrl.config.recipe import LrSchedulerCfg, OptimizerCfg
from hpcrl.core.backends.automodel.optim import build_lr_scheduler, build_optimizer

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
