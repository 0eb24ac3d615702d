"""gpt-oss under transformers 5 (NeMo RL's containers): its router returns (logits, top-k
weights, indices) and its experts take top-k weights, where transformers 4's router returns
dense scores. The Automodel worker over 2 gloo ranks, FSDP2 alone and with expert
parallelism (there from an MXFP4 checkpoint, dequantized), equals one process (the checks
of tests/core/test_gpt_oss.py)."""

from __future__ import annotations

import pytest

from tests.core.test_gpt_oss import check_two_ranks_equal_one_process


@pytest.mark.parametrize(("ep", "mxfp4"), [(1, False), (2, True)])
def test_gpt_oss_under_transformers_5_over_two_ranks_equals_one_process(tmp_path, ep, mxfp4):
    check_two_ranks_equal_one_process(tmp_path, ep, mxfp4)
