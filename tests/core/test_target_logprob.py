"""The fused log-prob head (``hpcrl.core.backends.automodel.target_logprob``) against what it
replaces: bf16 logits cast to float32, scaled by the temperature, torch's log-softmax at the
target (``token_logprobs_from_logits``), and the gradient autograd casts back to bf16.

The kernels run on CPU through Triton's interpreter (``TRITON_INTERPRET=1`` in a child
process: tests/triton_interpreter.py). Each ``check_*`` takes a device so that the same
check runs compiled on a GPU (``benchmarks/gpu_issue25.sh``'s parity step), where the head
also goes through ``model.token_logprobs``' dispatch (``fused_head_applies`` needs CUDA).
"""

from __future__ import annotations

import pytest

from tests.require import require_module
from tests.triton_interpreter import run_interpreted

torch = require_module("torch")
require_module("triton")


def _reference(logits, targets, temperature):
    from hpcrl.core.token_distribution import TokenDistribution, token_logprobs_from_logits

    unfiltered, _ = token_logprobs_from_logits(
        logits.float(), targets, TokenDistribution(temperature=temperature)
    )
    return unfiltered


def _values_and_grads(score, logits, targets, temperature, weights):
    leaf = logits.detach().requires_grad_(True)
    values = score(leaf, targets, temperature)
    (values * weights).sum().backward()
    return values.detach(), leaf.grad


def check_matches_torch(device: str, temperature: str, block_vocab: str) -> None:
    """[3, 5, 1000] bf16 logits (a column slice of wider ones: rows are strided), several
    vocabulary blocks per row: values to float32 rounding, gradients to a bf16 rounding."""
    from hpcrl.core.backends.automodel import target_logprob

    target_logprob.BLOCK_VOCAB = int(block_vocab)
    gen = torch.Generator().manual_seed(0)
    wide = (torch.randn(3, 5, 1008, generator=gen) * 4).to(torch.bfloat16).to(device)
    logits = wide[..., :1000]
    targets = torch.randint(0, 1000, (3, 5), generator=gen).to(device)
    targets[0, 0] = 999  # the last entry of the last (partial) block
    weights = torch.randn(3, 5, generator=gen).to(device)
    temp = float(temperature)
    mine = _values_and_grads(target_logprob.target_logprobs, logits, targets, temp, weights)
    theirs = _values_and_grads(_reference, logits, targets, temp, weights)
    assert mine[0].dtype == torch.float32 and mine[1].dtype == torch.bfloat16
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-6, atol=2e-5)
    flipped = (mine[1] != theirs[1]).float().mean().item()
    assert flipped < 0.01, flipped  # fp32 rounding may flip a few bf16 roundings
    torch.testing.assert_close(mine[1].float(), theirs[1].float(), rtol=2**-7, atol=1e-7)


def check_token_logprobs_dispatch(device: str) -> None:
    """``model.token_logprobs`` with and without the fused head (a GPU only: it dispatches
    on CUDA bf16 logits): the same log-probs and hidden-state gradients, kept and recomputed."""
    from hpcrl.core.backends.automodel.model import token_logprobs

    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 64, 32, generator=gen).to(device, torch.bfloat16)
    head = (torch.randn(500, 32, generator=gen) / 4).to(device, torch.bfloat16)
    ids = torch.randint(0, 500, (2, 64), generator=gen).to(device)
    for keep_bytes in (1 << 30, 0):
        results = []
        for fused in (True, False):
            leaf = hidden.detach().requires_grad_(True)
            processed, unfiltered = token_logprobs(
                leaf, head, ids, 48, keep_bytes=keep_bytes, fused=fused
            )
            assert torch.equal(processed, unfiltered)
            processed[:, 1:].sum().backward()
            results.append((processed.detach(), leaf.grad.float()))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-6, atol=2e-5)
        torch.testing.assert_close(results[0][1], results[1][1], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("temperature", "block_vocab"), [("1.0", "256"), ("0.7", "4096")])
def test_fused_head_matches_torch_log_softmax(temperature, block_vocab):
    run_interpreted(__name__, "check_matches_torch", "cpu", temperature, block_vocab)


def test_fused_head_is_used_only_where_it_applies():
    from hpcrl.core.backends.automodel.model import fused_head_applies
    from hpcrl.core.token_distribution import LogitTransform, TokenDistribution

    plain, bf16 = LogitTransform(), torch.bfloat16
    assert fused_head_applies("cuda", bf16, plain, TokenDistribution(temperature=0.7))
    assert not fused_head_applies("cpu", bf16, plain, TokenDistribution())  # Triton: a GPU's
    assert not fused_head_applies("cuda", torch.float32, plain, TokenDistribution())
    assert not fused_head_applies("cuda", bf16, LogitTransform(softcap=30.0), TokenDistribution())
    assert not fused_head_applies("cuda", bf16, LogitTransform(multiplier=0.5), TokenDistribution())
    assert not fused_head_applies("cuda", bf16, plain, TokenDistribution(top_k=5))
    assert not fused_head_applies("cuda", bf16, plain, TokenDistribution(top_p=0.9))
