"""``all_reduce_metrics``: sums, extrema and replicated figures come back in one read-back."""

import math

import pytest
import torch
import torch.distributed as dist

from hpcrl.core.metric_reduction import all_reduce_metrics


@pytest.fixture
def world_of_one():
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_sums_extrema_and_replicated_figures(world_of_one, monkeypatch):
    read_backs = []
    tolist = torch.Tensor.tolist

    def counted(tensor):
        read_backs.append(tensor.numel())
        return tolist(tensor)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    values = {
        "loss": torch.tensor(6.0),
        "probs_ratio_min": torch.tensor(0.25),
        "probs_ratio_max": 4.0,
    }
    got = all_reduce_metrics(
        values,
        sorted(values),
        torch.device("cpu"),
        sum_divisor=2.0,
        replicated={"grad_norm": torch.tensor(1.5, dtype=torch.float32)},
    )
    assert got == {"loss": 3.0, "probs_ratio_min": 0.25, "probs_ratio_max": 4.0, "grad_norm": 1.5}
    assert read_backs == [4]


def test_a_rank_that_does_not_contribute_gives_the_identities(world_of_one):
    got = all_reduce_metrics(
        {"loss": 2.0, "x_max": 1.0}, ["loss", "x_max"], torch.device("cpu"), contributes=False
    )
    assert got == {"loss": 0.0, "x_max": -math.inf}


def test_nothing_to_read(world_of_one):
    assert all_reduce_metrics({}, [], torch.device("cpu")) == {}
