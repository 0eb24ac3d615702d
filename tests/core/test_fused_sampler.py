"""The torch engine's fused sampler (``sampling.fused_sampler``, its CUDA path) against the
eager one (``sampling.sample_tokens``, its CPU path and reference): the same tokens and
log-probs from the same uniforms, one compilation for every batch size.

Real torch.compile with Inductor's CPU backend (a C++ compiler builds the kernels): the
graph Inductor is handed is the one it lowers for CUDA; only the kernels' code differs.
"""

from __future__ import annotations

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.core.generation.sampling import (  # noqa: E402
    fused_sampler,
    row_uniforms,
    sample_tokens,
)
from hpcrl.core.token_distribution import TokenDistribution  # noqa: E402

# compiled_piece's eager fallback warns: here that is a failure, not a slower pass
pytestmark = [
    pytest.mark.filterwarnings("error:.*torch.compile failed"),
    pytest.mark.usefixtures("one_torch_thread"),
]

VOCAB = 48
BATCH_SIZES = (7, 2, 1, 64)  # the first call compiles; the others must not

CASES = {
    "t1": (TokenDistribution(), False),
    "t0.7-topk5": (TokenDistribution(temperature=0.7, top_k=5), False),
    "t1.3-topp0.6": (TokenDistribution(temperature=1.3, top_p=0.6), False),
    "greedy": (TokenDistribution(), True),
}


@pytest.fixture(scope="module")
def fused():
    return fused_sampler()


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _logits(batch: int, seed: int, integer: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, VOCAB, generator=gen) * 3
    # integer logits: many exact ties, at the k-th value and across the top-p boundary
    return logits.round() if integer else logits


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_fused_sampler_equals_the_eager_one_without_recompiling(fused, case: str) -> None:
    distribution, greedy = CASES[case]
    graphs_after_first = None
    for index, batch in enumerate(BATCH_SIZES):
        for integer in (False, True):
            logits = _logits(batch, seed=index, integer=integer)
            uniforms = row_uniforms(5, torch.arange(batch), index)
            tokens, logprobs = fused(logits, distribution, uniforms, greedy=greedy)
            want_tokens, want_logprobs = sample_tokens(
                logits, distribution, uniforms, greedy=greedy
            )
            assert tokens.dtype == want_tokens.dtype and tokens.shape == (batch,)
            assert torch.equal(tokens, want_tokens), (batch, integer)
            torch.testing.assert_close(logprobs, want_logprobs, atol=1e-5, rtol=0)
            assert bool(torch.isfinite(logprobs).all()), "a filtered token was drawn"
            if graphs_after_first is None:
                graphs_after_first = _graphs()
    assert _graphs() == graphs_after_first, "a batch size recompiled"


@pytest.mark.slow
def test_fused_sampler_keeps_the_contracts_kept_set(fused) -> None:
    """Over many draws from one row with ties at the k-th value: every token the filter
    keeps is drawn, none it drops, under both samplers alike."""
    row = torch.tensor([[4.0, 4.0, 4.0, 3.0, 1.0, 0.0] + [-2.0] * (VOCAB - 6)])
    distribution = TokenDistribution(temperature=0.7, top_k=2)  # ties: k=2 keeps 3
    draws = 4096
    logits = row.expand(draws, VOCAB).contiguous()
    uniforms = row_uniforms(11, torch.arange(draws), 0)
    tokens, logprobs = fused(logits, distribution, uniforms, greedy=False)
    want, _ = sample_tokens(logits, distribution, uniforms, greedy=False)
    assert torch.equal(tokens, want)
    assert set(tokens.tolist()) == {0, 1, 2}
    torch.testing.assert_close(logprobs, torch.full((draws,), -torch.log(torch.tensor(3.0))))


def test_compiled_pieces_compile_once_for_sizes_equal_at_the_first_call() -> None:
    """``compiled_piece`` (the sampler's and the decoder's pointwise pieces') turns duck
    shaping off while it calls: two sizes equal at the first call stay two symbols, so
    unequal ones later compile nothing new; the setting is restored after every call."""
    import torch.fx.experimental._config as fx_config

    from hpcrl.core.generation.compiled import compiled_piece

    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def piece(a, b):
        return (a * 2).sum() + (b + 1).sum()

    compiled = compiled_piece(piece, backend=counting_backend)
    duck_shape = fx_config.use_duck_shape
    for a_rows, b_rows in ((5, 5), (6, 4), (3, 8)):
        got = compiled(torch.ones(a_rows, 7), torch.ones(b_rows, 5))
        assert float(got) == 14 * a_rows + 10 * b_rows
        assert fx_config.use_duck_shape == duck_shape
    assert len(graphs) == 1
