"""Triton's per-process key is paid in the worker's setup when a GPU is present
(``hpcrl.core.workers.first_launch``), not at the first step's first kernel launch; without
a GPU nothing is done. Only the predicate ``torch.cuda.is_available`` is replaced here: the
key itself is Triton's real one (it hashes Triton's installed files)."""

from __future__ import annotations

import pytest

from tests.require import require_module


@pytest.mark.parametrize("gpu", [True, False])
def test_setup_pays_tritons_key_only_with_a_gpu(monkeypatch, gpu):
    torch = require_module("torch")
    require_module("triton")
    from torch._inductor.runtime.triton_compat import HAS_TRITON, triton_key

    from hpcrl.core.workers.first_launch import pay_triton_key

    assert HAS_TRITON, "Inductor sees no usable Triton although the triton package imports"
    triton_key.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert pay_triton_key() is gpu
    # computed now (cached for the process): the first kernel launch finds it
    assert triton_key.cache_info().currsize == (1 if gpu else 0)
