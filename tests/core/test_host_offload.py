"""``policy.automodel_cfg.optimizer_offload_fraction``: Adam/AdamW with the state of a share
of the parameters in host memory (``hpcrl.core.backends.automodel.host_offload``).

On this machine the "device" is the CPU as well: the host part steps a second copy of its
chunks (staged, stepped with torch's fused CPU Adam, copied back), so these tests show the
split, the chunking, the step counts and the state placement against plain torch AdamW; the
boundary they cannot show is the real device-to-host / host-to-device traffic (pinned
buffers, the two copy streams and their events), which only a GPU exercises (the H200 runs in
docs/performance.md, "8B on one H200").
"""

from __future__ import annotations

import pytest
import torch

from hpcrl.config.recipe import OptimizerCfg
from hpcrl.core.backends.automodel import checkpoint
from hpcrl.core.backends.automodel.host_offload import (
    HostOffloadAdam,
    offloaded_prefix,
    plan_chunks,
)
from hpcrl.core.backends.automodel.optim import build_training_optimizer

KWARGS = {"lr": 1e-2, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8}


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    # sizes that make chunks of 7 elements cut through tensors and span several of them
    return torch.nn.Sequential(
        torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3), torch.nn.Linear(3, 2)
    )


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        inputs = torch.randn(4, 5, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        model(inputs).pow(2).sum().backward()
        optimizer.step()


def _hybrid(model: torch.nn.Module, fraction: float, **extra) -> HostOffloadAdam:
    return HostOffloadAdam(
        model.parameters(), offload_fraction=fraction, chunk_numel=7,
        decoupled_weight_decay=True, **KWARGS, **extra,
    )  # fmt: skip


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_a_hybrid_step_equals_plain_adamw(fraction, amsgrad) -> None:
    plain_model, hybrid_model = _model(), _model()
    plain = torch.optim.AdamW(plain_model.parameters(), amsgrad=amsgrad, **KWARGS)
    hybrid = _hybrid(hybrid_model, fraction, amsgrad=amsgrad)
    total = sum(p.numel() for p in hybrid_model.parameters())
    offloaded = sum(p.numel() for p in hybrid.host_params)
    assert offloaded == {0.0: 0, 0.5: 30 + 6, 1.0: total}[fraction]  # whole tensors, ≥ half
    _train(plain_model, plain, steps=5, seed=1)
    _train(hybrid_model, hybrid, steps=5, seed=1)
    for mine, theirs in zip(hybrid_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
        assert int(hybrid.state[mine]["step"]) == 5  # once per step, however many chunks
        torch.testing.assert_close(
            hybrid.state[mine]["exp_avg_sq"], plain.state[theirs]["exp_avg_sq"]
        )
    # parameters that moved at all: the step did something on both sides
    assert not torch.equal(next(hybrid_model.parameters()), next(_model().parameters()))


def test_plain_adam_weight_decay_is_coupled_on_the_host_too() -> None:
    plain_model, hybrid_model = _model(), _model()
    plain = torch.optim.Adam(plain_model.parameters(), **KWARGS)
    hybrid = HostOffloadAdam(
        hybrid_model.parameters(), offload_fraction=1.0, chunk_numel=7, **KWARGS
    )
    _train(plain_model, plain, steps=3, seed=2)
    _train(hybrid_model, hybrid, steps=3, seed=2)
    for mine, theirs in zip(hybrid_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_chunks_cover_every_element_once() -> None:
    params = list(_model().parameters())
    chunks = plan_chunks(params, 7)
    assert all(sum(p.stop - p.start for p in chunk) <= 7 for chunk in chunks)
    covered = {id(p): [] for p in params}
    for chunk in chunks:
        for piece in chunk:
            covered[id(piece.param)].append((piece.start, piece.stop))
    for param in params:
        spans = sorted(covered[id(param)])
        assert spans[0][0] == 0 and spans[-1][1] == param.numel()
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert offloaded_prefix(params, 0.0) == [] and offloaded_prefix(params, 1.0) == params


def test_the_fraction_picks_the_optimizer_the_worker_builds() -> None:
    cfg = OptimizerCfg(name="torch.optim.AdamW", kwargs={"lr": 1e-3})
    model = _model()
    plain = build_training_optimizer(
        model.parameters(), cfg, on_gpu=False, cpu_offload=False, offload_fraction=0.0
    )
    hybrid = build_training_optimizer(
        model.parameters(), cfg, on_gpu=False, cpu_offload=False, offload_fraction=0.5
    )
    assert type(plain) is torch.optim.AdamW and type(hybrid) is HostOffloadAdam
    assert hybrid.param_groups[0]["decoupled_weight_decay"] is True
    assert 0 < len(hybrid.host_params) < len(list(model.parameters()))


@pytest.fixture
def process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _make(fraction: float | None, seed: int = 0):
    model = _model(seed)
    if fraction is None:
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), **KWARGS)
    else:
        optimizer = _hybrid(model, fraction)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 0.5, 1.0, total_iters=4)
    return model, optimizer, scheduler


def _train_scheduled(model, optimizer, scheduler, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(4, 5, generator=generator)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize(
    ("saved_with", "loaded_with"), [(0.5, 0.5), (1.0, 0.5), (0.5, None), (None, 1.0)]
)
def test_resume_is_exact_whatever_the_fraction(saved_with, loaded_with, process_group, tmp_path):
    """Through the backend's own DCP save/load: 3 steps, save, 3 more — against a fresh
    optimizer (another fraction, or plain AdamW) loaded from the save for the last 3."""
    model, optimizer, scheduler = _make(saved_with)
    _train_scheduled(model, optimizer, scheduler, 3, seed=4)
    checkpoint.save(str(tmp_path / "ck"), model, optimizer, scheduler, step=3)
    _train_scheduled(model, optimizer, scheduler, 3, seed=5)

    resumed = _make(loaded_with, seed=9)  # other weights: the load must replace them
    assert checkpoint.load(str(tmp_path / "ck"), *resumed) == 3
    if isinstance(resumed[1], HostOffloadAdam):
        for param in resumed[1].host_params:
            state = resumed[1].state[param]
            assert state["exp_avg"].device.type == "cpu" and int(state["step"]) == 3
    _train_scheduled(*resumed, 3, seed=5)
    for mine, theirs in zip(resumed[0].parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)
    assert resumed[2].get_last_lr() == scheduler.get_last_lr()
