"""The Automodel worker's pass figures (``hpcrl.core.backends.pass_stats``): micro-batches,
token slots against real tokens and worker seconds per kind of pass, summed until read, and
the step's loss metrics read back once (they stay device tensors until the all-reduce)."""

from __future__ import annotations

import functools
import math
import socket

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.config.recipe import LossFnCfg  # noqa: E402
from hpcrl.core.algorithms.losses import grpo_loss  # noqa: E402
from hpcrl.core.backends.automodel.worker import AutomodelWorker  # noqa: E402
from hpcrl.core.backends.base import RankInfo  # noqa: E402
from hpcrl.core.workers.micro_batches import row_extents  # noqa: E402
from hpcrl.core.workers.sharding import split_micro_batches  # noqa: E402
from tests.core.parallel_harness import make_batch  # noqa: E402
from tests.recipe_builder import tiny_automodel_recipe  # noqa: E402


@pytest.fixture
def worker(tiny_model_path):
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                    master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
    worker = AutomodelWorker()
    worker.setup(tiny_automodel_recipe(micro_batch_size=2), info, tiny_model_path)
    try:
        yield worker
    finally:
        worker.close()
        dist.destroy_process_group()


def test_passes_count_micro_batches_and_tokens_until_read(worker) -> None:
    batch = make_batch(3, batch_size=6, seq_len=20)
    real = int(batch["attention_mask"].sum())
    extents = row_extents(batch)
    worker.logprobs(batch)
    worker.reference_logprobs(batch)
    batch["old_logprobs"] = worker.logprobs(batch)
    batch["ref_logprobs"] = batch["old_logprobs"] - 0.1
    batch["generation_logprobs"] = batch["old_logprobs"] + 0.05
    batch["advantages"] = torch.linspace(-1.0, 1.0, 6)
    batch["num_global_sequences"] = torch.full((6,), 6.0)
    loss_fn = functools.partial(grpo_loss, cfg=LossFnCfg(reference_policy_kl_penalty=0.1))
    micro = split_micro_batches(batch, 2)
    result = worker.train_step(micro, loss_fn, float(batch["token_mask"].sum()))
    metrics = worker.take_pass_metrics()

    # log-prob micro-batches: logprob_batch_size (= train_micro_batch_size, 2) rows each, cut
    # to their own last real column; no compile on CPU, so no bucket padding
    slots = sum(2 * max(extents[i : i + 2]) for i in range(0, 6, 2))
    assert metrics["logprobs_passes"] == 2 and metrics["reference_passes"] == 1
    assert metrics["logprobs_micro_batches"] == 6 and metrics["reference_micro_batches"] == 3
    assert metrics["logprobs_token_slots"] == 2 * slots
    assert metrics["logprobs_real_tokens"] == 2 * real
    assert metrics["reference_real_tokens"] == real
    # train micro-batches are the ones handed in (full width here)
    assert metrics["train_passes"] == 1 and metrics["train_micro_batches"] == 3
    assert metrics["train_token_slots"] == 6 * 20 and metrics["train_real_tokens"] == real
    parts = metrics["time_train_forward_backward_s"] + metrics["time_train_optimizer_s"]
    assert 0 < parts <= metrics["time_train_worker_s"]
    assert not any(key.endswith("host_syncs") for key in metrics)  # counted on CUDA only
    assert worker.take_pass_metrics() == {}
    # the loss metrics arrive as floats after the one read-back
    assert isinstance(result["kl"], float) and math.isfinite(result["kl"]) and result["kl"] > 0
    assert isinstance(result["loss"], float)
