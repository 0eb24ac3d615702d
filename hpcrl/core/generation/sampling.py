"""Drawing one token per row from logits, on the device, without host synchronisation.

Randomness is counter-based: the uniform number behind row ``r``'s token ``t`` is a hash of
(seed, r, t), not a draw from a stateful generator. So a row's sample does not depend on
which other rows share its batch, on batch compaction, on CUDA graph replay or on the device
(CPU and GPU hash alike), and nothing has to be seeded globally. A token is then picked by
inverse-CDF sampling (one uniform per row, a cumulative sum and a binary search), which needs
only ``B`` random numbers per step where Gumbel-max would need ``B × vocab``.

The distribution sampled from, and the log-prob returned, is the log-prob contract's
``log_softmax(filter(logits / T))`` (``hpcrl.core.token_distribution.processed_logits``, the
one implementation the trainer's log-prob passes use too); greedy (temperature 0) takes the
argmax of the raw logits and scores it at temperature 1.

Two implementations of the same draw: ``sample_tokens``, eager (the CPU path, greedy
decoding, and the reference), and ``fused_sampler``'s ``pick_tokens`` through torch.compile
(the CUDA path for sampling). The compiled pick is written as few passes over the logits: a
row reduction (max and sum of exponentials: the log-normaliser), a scan (the CDF of
``exp(logit − log-normaliser)``) and a row reduction that counts the CDF entries at or below
the target (``searchsorted(cdf, target, right=True)`` is that count, since a CDF never
decreases), reading the chosen token's log-prob on the way; top-k / top-p run the
contract's own ``filter_logits`` inside it, so the kept set is the trainer's. Inductor
fuses less than that (the scan stays apart from the reductions), so the fused path is about
as fast as the eager one, not faster: ``benchmarks/sampler_throughput.py`` measures it
(docs/performance.md, "Figures behind the code").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hpcrl.core.token_distribution import filter_logits, processed_logits, scale_logits

if TYPE_CHECKING:
    import torch

    from hpcrl.core.token_distribution import TokenDistribution

_MASK32 = 0xFFFFFFFF
# lowbias32 (Chris Wellons' hash-prospector); the multiplications are split into 16-bit
# halves so every intermediate fits a signed 64-bit integer exactly on any device.
_MUL_A = 0x7FEB352D
_MUL_B = 0x846CA68B


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """``(x * constant) mod 2**32`` for int64 tensors holding values below 2**32."""
    low, high = constant & 0xFFFF, constant >> 16
    return ((x * low) + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _MUL_A)
    x = x ^ (x >> 15)
    x = _mul32(x, _MUL_B)
    return x ^ (x >> 16)


def row_uniforms(seed: int, row_ids: torch.Tensor, token_index: int | torch.Tensor) -> torch.Tensor:
    """Uniform floats in [0, 1), one per row: a pure function of (seed, row id, token index)."""
    import torch

    seeded = _mix32(torch.full_like(row_ids, seed & _MASK32, dtype=torch.int64))
    mixed = _mix32((seeded + row_ids.to(torch.int64)) & _MASK32)
    mixed = _mix32((mixed + token_index) & _MASK32)
    return (mixed >> 8).to(torch.float32) * (1.0 / (1 << 24))


def sample_tokens(
    logits: torch.Tensor, distribution: TokenDistribution, uniforms: torch.Tensor, *, greedy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [B], their log-probs [B]) from float logits [B, V] and uniforms [B].

    ``greedy`` takes the argmax (``distribution`` then scores it; ``of_generation`` gives a
    greedy configuration temperature 1)."""
    import torch

    processed = processed_logits(logits, distribution)
    logprobs_all = torch.log_softmax(processed, dim=-1)
    if greedy:
        tokens = logits.argmax(dim=-1)
    else:
        tokens = inverse_cdf_sample(logprobs_all.exp(), uniforms)
    return tokens, logprobs_all.gather(-1, tokens[:, None])[:, 0]


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index ``i`` with probability ``probs[:, i]`` (rows need not sum to exactly 1)."""
    import torch

    cdf = probs.cumsum(dim=-1)
    targets = uniforms[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, targets, right=True)[:, 0].clamp(max=probs.shape[-1] - 1)
    # Rounding can only land past the last positive-probability token at the very top of the
    # CDF; fall back to the most likely token there instead of a filtered one.
    positive = probs.gather(-1, picked[:, None])[:, 0] > 0
    return torch.where(positive, picked, probs.argmax(dim=-1))


#: ``sample_tokens``'s signature: (logits, distribution, uniforms, *, greedy) -> (ids, log-probs)
SampleTokens = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]


def pick_tokens(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_tokens`` (not greedy) written for torch.compile: the same tokens and
    log-probs (up to float rounding at a CDF boundary), without the ``[B, V]`` log-softmax
    and probability tensors in between. Plain scalars instead of a ``TokenDistribution``:
    what a compilation holds for is decided by dynamo's guards on them."""
    import torch

    processed = scale_logits(logits, temperature)
    if (top_k is not None and top_k > 0) or top_p < 1.0:
        processed = filter_logits(processed, top_k, top_p)
    peak, most_likely = processed.max(dim=-1, keepdim=True)  # one pass: both reductions
    log_total = peak + (processed - peak).exp().sum(dim=-1, keepdim=True).log()  # [B, 1]
    cdf = (processed - log_total).exp().cumsum(dim=-1)
    targets = uniforms[:, None] * cdf[:, -1, None]
    picked = (cdf <= targets).sum(dim=-1).clamp(max=logits.shape[-1] - 1)
    # as in inverse_cdf_sample: never a token of probability 0 (rounding at the top)
    picked_logprob = processed.gather(-1, picked[:, None])[:, 0] - log_total[:, 0]
    tokens = torch.where(picked_logprob.exp() > 0, picked, most_likely[:, 0])
    return tokens, processed.gather(-1, tokens[:, None])[:, 0] - log_total[:, 0]


def fused_sampler(backend: Any = "inductor") -> SampleTokens:
    """``sample_tokens`` through one compiled ``pick_tokens`` (``compiled.compiled_piece``).

    Every batch size shares one compilation per distribution: the batch dimension is
    unbacked, so a batch of one row (the last live row after compaction) compiles nothing
    new either. Greedy decoding stays eager (``sample_tokens``): an argmax and one
    log-normaliser are three kernels, and the compiled call's dispatch cost more than it
    saved (measured: docs/performance.md, "Figures behind the code"). Another distribution compiles
    once more (another kind — unfiltered, top-k, top-p, both — always; another temperature or top-p value of the same kind may,
    as dynamo decides to specialise a float or not). Past torch._dynamo's ``recompile_limit``
    (8 compilations of ``pick_tokens`` in one process; a run samples from one distribution
    or two) the sampler runs eagerly, with a warning. ``backend``: torch.compile's."""
    from torch._dynamo.decorators import mark_unbacked

    from hpcrl.core.generation.compiled import compiled_piece

    def mark_batch_unbacked(args: Sequence[Any]) -> None:
        logits, uniforms = args[0], args[1]
        mark_unbacked(logits, 0)
        mark_unbacked(uniforms, 0)

    # marked for a compilation only: a kept compilation's guards refuse marked tensors
    pick = compiled_piece(pick_tokens, backend=backend, mark_for_compile=mark_batch_unbacked)

    def sample(
        logits: torch.Tensor,
        distribution: TokenDistribution,
        uniforms: torch.Tensor,
        *,
        greedy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if greedy:
            return sample_tokens(logits, distribution, uniforms, greedy=True)
        d = distribution
        return pick(logits, uniforms, d.temperature, d.top_k, d.top_p)

    return sample
