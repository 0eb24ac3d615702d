"""The first calls of an earlier run's kept block compilations, made at the end of setup.

Loading a kept compilation (``BlockCompilations.preload``) leaves work for its first call:
Inductor imports the compiled graphs' generated modules and its runtime autotuner benchmarks
the kernels that have several launch configurations, and cuBLAS picks its kernels. On an
H200 that was most of what a warm first GRPO step's log-prob and train passes paid above
their steady time (0.33 s against 0.04 s and 0.56 s against 0.14 s; docs/performance.md, item
3, eighth session). This runs one log-prob pass and one forward-backward of a small batch of
token 0 through the policy while the worker sets up, then drops the gradients: the optimizer,
its state and the weights are untouched, and the RNG streams are restored.

Each call has the shape of the call that built the kept compilation of its kind (the index
records it: ``aot_precompiled.IndexEntry``; the job's own micro-batches have it too). A smaller
warm-up was refused: Inductor guards some fusion choices on the token count (``rows * columns
>= 4096`` among the kept train block's guards on an H100), so the 32 x 64 batch this made before
compiled the block once more in setup (6.9-9.9 s; docs/performance.md, item 3, tenth session).
Without a recorded shape (an index written before) it uses the train micro-batch's rows and the
sequence multiple. Afterwards the caching allocator gives back what the calls reserved, so
that a colocated engine sizes its cache from the same free memory as without them.
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
    *,
    eval_shape: tuple[int, int],
    train_shape: tuple[int, int],
    device: torch.device,
) -> float:
    """One no-grad pass in eval mode (the log-prob passes' kind of call) on ``eval_shape``
    (rows, columns) right-padded tokens and one forward-backward in train mode (the train
    pass's) on ``train_shape``, as the worker's passes call the model. Returns the seconds
    taken."""
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs

    started = time.perf_counter()
    with _rng_kept(device):
        model.eval()
        with torch.no_grad():
            forward_logprobs(model, _tokens(eval_shape, device), distribution, causal_only=True)
        model.train()
        processed, _ = forward_logprobs(
            model, _tokens(train_shape, device), distribution, causal_only=True
        )
        processed.float().sum().backward()
        for param in model.parameters():
            param.grad = None
        if model.compute_copies is not None:
            model.compute_copies.drop_gradients()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return time.perf_counter() - started


def _tokens(shape: tuple[int, int], device: torch.device) -> dict[str, torch.Tensor]:
    """``rows`` x ``columns`` of token 0, no padding."""
    return {
        "input_ids": torch.zeros(shape, dtype=torch.long, device=device),
        "attention_mask": torch.ones(shape, dtype=torch.long, device=device),
    }


@contextlib.contextmanager
def _rng_kept(device: torch.device) -> Iterator[None]:
    """The same random numbers afterwards as without these calls."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        yield
