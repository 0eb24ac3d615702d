"""Sequence packing (THD layout, ``PackedSeqParams``) and dynamic batching on the Megatron
backend give the fixed micro-batches' log-probs, loss and gradients (real megatron-core,
local spec with hpcrl's SDPA core attention, gloo, hpcrl's CPU compatibility layer).

Tolerance stated: float32 — log-probs within 1e-5, loss within 1e-6 relative, every
gradient within 1e-5 (max abs)."""

from __future__ import annotations

import pytest

from tests.megatron import harness
from tests.megatron.packing_ranks import packing_run

pytestmark = pytest.mark.slow


def test_packed_and_dynamic_equal_fixed(converted):
    hf_path, root = converted
    result = harness.run_ranks(1, packing_run, hf_path, root)[0]
    fixed = result["fixed"]
    for way in ("dynamic", "packed"):
        got = result[way]
        assert (got["logprobs"] - fixed["logprobs"]).abs().max() < 1e-5, way
        assert got["loss"] == pytest.approx(fixed["loss"], rel=1e-6), way
        worst = max(
            float((got["grads"][n] - fixed["grads"][n]).abs().max()) for n in fixed["grads"]
        )
        assert worst < 1e-5, (way, worst)
        assert got["num_micro_batches"] < fixed["num_micro_batches"], way  # rows were grouped
