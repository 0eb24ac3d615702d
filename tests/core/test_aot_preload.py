"""Kept compilations preloaded before their first call (``PrecompiledPieces.preload``): the
guards dynamo builds while loading take the thread's dispatch keys as they are then, and
autocast is among them; so each file is loaded under the autocast its calls ran under (the
index records it), else every call is refused, and a refusal is counted with dynamo's reason.

Real ``aot_compile`` with Inductor on CPU, in this process; autocast on the CPU (bfloat16)
stands for the bf16 CUDA autocast of the Automodel blocks on one GPU.
"""

from __future__ import annotations

import warnings

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.core.generation import aot_precompiled  # noqa: E402
from hpcrl.core.generation.aot_precompiled import PrecompiledPieces  # noqa: E402


def scaled_block(layer, hidden):
    """What is kept: a module called with its input, as the Automodel blocks are."""
    return layer(hidden).relu() * 2


def kept_pieces() -> PrecompiledPieces:
    pieces = PrecompiledPieces.for_piece(scaled_block, "inductor")
    assert pieces is not None
    return pieces


@pytest.mark.slow  # one Inductor C++ compilation (~20 s on the 2-core box)
def test_a_preloaded_compilation_takes_the_calls_of_its_autocast(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    layer, hidden = torch.nn.Linear(16, 16), torch.randn(3, 5, 16)
    autocast = torch.autocast("cpu", torch.bfloat16)
    cold = kept_pieces()
    with autocast:
        want = scaled_block(layer, hidden)
        built = cold.matching((layer, hidden))
        assert built is not None and cold.builds == 1
        torch.testing.assert_close(built(layer, hidden), want, rtol=0, atol=0)
    index = cold.index_path.read_text().split()
    assert index[1:] == ["autocast:cpu:bfloat16", "grad:1", "shape:3x5x16"], index

    before = dict(aot_precompiled.TALLY)
    warm = kept_pieces()  # the next run: loaded in setup, outside any autocast
    assert warm.preload() == 1
    with autocast:
        loaded = warm.matching((layer, hidden))
        assert loaded is not None, warm.rejections
        torch.testing.assert_close(loaded(layer, hidden), want, rtol=0, atol=0)
    assert warm.builds == 0 and warm.rejections == [] and warm.failures == []
    # the building call's grad mode and first tensor's shape, for the warm-up (first_calls)
    assert list(warm.kept_calls.values()) == [(True, (3, 5, 16))]
    assert aot_precompiled.TALLY["aot_loads"] == before["aot_loads"] + 1
    assert aot_precompiled.TALLY["aot_guard_rejections"] == before["aot_guard_rejections"]

    # An index line without the autocast (as written before it was recorded) loads outside
    # it: its guards refuse the call, which is counted once with dynamo's failing guard.
    cold.index_path.write_text(index[0] + "\n")
    unmarked = kept_pieces()
    assert unmarked.preload() == 1
    with autocast, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert unmarked.matching((layer, hidden)) is None
    assert len(unmarked.rejections) == 1, unmarked.rejections
    assert "dispatch key set mismatch" in unmarked.rejections[0]
    assert "AutocastCPU" in unmarked.rejections[0]
    assert aot_precompiled.TALLY["aot_guard_rejections"] == before["aot_guard_rejections"] + 1
    assert any("dispatch key set mismatch" in str(w.message) for w in caught)
    assert unmarked.builds == 0  # refused: the caller's ordinary compilation takes the call

    # An index of the format before the calls were recorded (its old name) is not read: the
    # file loads at its first call, which writes the new index with that call's shape.
    old_name = cold.index_path.with_name(cold.index_path.name.replace(".calls.index", ".index"))
    cold.index_path.rename(old_name)
    healed = kept_pieces()
    assert healed.preload() == 0
    with autocast:
        assert healed.matching((layer, hidden)) is not None
    assert (healed.loads, healed.builds) == (1, 0)
    assert healed.index_path.read_text().split()[1:] == [
        "autocast:cpu:bfloat16", "grad:1", "shape:3x5x16",
    ]  # fmt: skip


@pytest.mark.slow  # one Inductor C++ compilation (~20 s on the 2-core box)
def test_a_refusal_names_the_relation_that_is_false(monkeypatch, tmp_path):
    # A compilation with dynamic sizes guards its input's stride as a relation among the
    # shape guard's others (true ones too); the log must say which one refused the call.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    layer, hidden = torch.nn.Linear(16, 16), torch.randn(3, 5, 16)
    torch._dynamo.mark_dynamic(hidden, 0)
    torch._dynamo.mark_dynamic(hidden, 1)
    pieces = kept_pieces()
    assert pieces.matching((layer, hidden)) is not None
    sliced = torch.randn(4, 6, 16)[:, :5]  # stride[0] 96, not 16 x 5
    pieces.signatures_tried.clear()  # as a later call of the same kind would be checked
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert pieces.matching((layer, sliced)) is None
    (reason,) = pieces.rejections
    false, _, relations = reason.partition(" | the guard's relations: ")
    assert "false: L['hidden'].stride()[0] == 16*L['hidden'].size()[1]" in false, reason
    assert "2 <= L['hidden'].size()[0]" in relations and "2 <= " not in false  # true ones


def test_index_lines_old_and_new_parse():
    """Lines written before the autocast or the call were recorded still load (as before)."""
    from hpcrl.core.generation.aot_precompiled import IndexEntry

    new = IndexEntry.parse("block_call-ab.bin autocast:cuda:bfloat16 grad:0 shape:8x4096x2048")
    assert new == IndexEntry(
        "block_call-ab.bin", ("autocast:cuda:bfloat16",), (False, (8, 4096, 2048))
    )
    old = IndexEntry.parse("block_call-ab.bin autocast:cuda:bfloat16")
    assert old == IndexEntry("block_call-ab.bin", ("autocast:cuda:bfloat16",), None)
    assert IndexEntry.parse("block_call-ab.bin").call is None
    assert IndexEntry.parse("x.bin grad:1 shape:").call is None  # a 0-dim first tensor
    assert IndexEntry.parse("   ").name == ""
