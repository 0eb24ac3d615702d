"""The first calls of an earlier run's kept block compilations, made at the end of setup.

Loading a kept compilation (``BlockCompilations.preload``) leaves work for its first call:
Inductor imports the compiled graphs' generated modules and its runtime autotuner benchmarks
the kernels that have several launch configurations, and cuBLAS picks its kernels. On an
H200 that was most of what a warm first GRPO step's log-prob and train passes paid above
their steady time (0.33 s against 0.04 s and 0.56 s against 0.14 s; docs/performance.md, item
3, eighth session). This runs one log-prob pass and one forward-backward of a small batch of
token 0 through the policy while the worker sets up, then drops the gradients: the optimizer,
its state and the weights are untouched, and the RNG streams are restored.

A kept compilation whose guards refuse the warm-up batch is compiled again for it (counted in
``aot_guard_rejections``, its guard in the log), in setup: on an H100 the kept train
compilation refused the 32 x 64 batch while it took the job's own calls, and setup compiled
the block once more (6.6 s; docs/performance.md, item 3, eighth session). Running such calls
eagerly instead was built on CPU and not measured on a GPU; that is the next step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hpcrl.core.backends.automodel.model import TokenLogprobModel
    from hpcrl.core.token_distribution import TokenDistribution


def run_first_calls(
    model: TokenLogprobModel,
    distribution: TokenDistribution,
    rows: int,
    columns: int,
    device: torch.device,
) -> float:
    """One no-grad pass in eval mode (the log-prob passes' kind of call) and one
    forward-backward in train mode (the train pass's), on ``rows`` x ``columns`` right-padded
    tokens, as the worker's passes call the model. ``rows`` >= 2: one row would be
    specialised by the compiled blocks. Returns the seconds taken."""
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs

    assert rows >= 2, "a single row compiles a graph of its own"
    started = time.perf_counter()
    batch = {
        "input_ids": torch.zeros(rows, columns, dtype=torch.long, device=device),
        "attention_mask": torch.ones(rows, columns, dtype=torch.long, device=device),
    }
    with _rng_kept(device):
        model.eval()
        with torch.no_grad():
            forward_logprobs(model, batch, distribution, causal_only=True)
        model.train()
        processed, _ = forward_logprobs(model, batch, distribution, causal_only=True)
        processed.float().sum().backward()
        for param in model.parameters():
            param.grad = None
        if model.compute_copies is not None:
            model.compute_copies.drop_gradients()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


@contextlib.contextmanager
def _rng_kept(device: torch.device) -> Iterator[None]:
    """The same random numbers afterwards as without these calls."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        yield
