"""hpcrl's CPU compatibility layer (hpcrl/core/backends/megatron/cpu_compat.py) and the TE
placeholders fail loudly when megatron-core moves under them, and leave nothing behind."""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from hpcrl.core.backends.megatron import cpu_compat
from hpcrl.core.backends.megatron.bridge_compat import import_bridge


def test_every_patch_applies_to_the_installed_megatron_core():
    cpu_compat.check_patches_apply()


def test_a_patch_whose_target_changed_fails_loudly(monkeypatch):
    import megatron.core

    moved = cpu_compat.CpuPatch(
        name="cpu_rng_tracker",
        why="",
        requires=(
            (
                "megatron.core.tensor_parallel.random:CudaRNGStatesTracker.add",
                "torch.cuda.rng_v2()",
            ),
        ),
    )
    monkeypatch.setattr(cpu_compat, "PATCHES", (moved,))
    with pytest.raises(
        cpu_compat.CpuCompatError,
        match=f"patch cpu_rng_tracker no longer applies to megatron-core {megatron.core.__version__}",
    ):
        cpu_compat.check_patches_apply()


def test_a_patch_whose_target_is_gone_fails_loudly(monkeypatch):
    gone = cpu_compat.CpuPatch(
        name="gone", why="", requires=(("megatron.core.optimizer:NoSuchThing", "x"),)
    )
    monkeypatch.setattr(cpu_compat, "PATCHES", (gone,))
    with pytest.raises(cpu_compat.CpuCompatError, match="NoSuchThing is gone"):
        cpu_compat.check_patches_apply()


def test_another_megatron_core_version_fails_with_what_to_do(monkeypatch):
    import megatron.core

    monkeypatch.setattr(megatron.core, "__version__", "0.20.0")
    with pytest.raises(cpu_compat.CpuCompatError) as error:
        cpu_compat.check_patches_apply()
    message = str(error.value)
    assert (
        "supports megatron-core 0.16.x and 0.19.x only; this Python has megatron-core 0.20.0"
        in (message)
    )
    assert "or run the job on GPUs (a profile with device: gpu)" in message
    assert "`pip install 'megatron-core==0.16.*'`" in message
    assert "`pip install 'megatron-core==0.19.*'`" in message
    assert (
        "set SUPPORTED_PREFIXES['megatron-core'] in hpcrl/core/backends/megatron/cpu_compat.py"
        in message
    )


def test_another_megatron_bridge_version_fails_with_what_to_do(monkeypatch):
    bridge = import_bridge()
    monkeypatch.setattr(bridge, "__version__", "0.7.0")
    with pytest.raises(cpu_compat.CpuCompatError) as error:
        cpu_compat.check_patches_apply()
    message = str(error.value)
    assert (
        "supports megatron-bridge 0.3.x and 0.6.x only; this Python has megatron-bridge 0.7.0"
        in (message)
    )
    assert "`pip install --no-deps 'megatron-bridge==0.3.*'`" in message


def test_the_scatter_patch_is_for_bridge_0_3_only():
    (scatter,) = [p for p in cpu_compat.PATCHES if p.name == "bridge_contiguous_scatter"]
    assert scatter.applies_to({"megatron-bridge": "0.3.1", "megatron-core": "0.16.1"})
    assert not scatter.applies_to({"megatron-bridge": "0.6.2", "megatron-core": "0.19.2"})


def test_bridge_scatter_patch_hands_contiguous_pieces_and_is_undone():
    import_bridge()
    from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

    # At tp_size 1 the bridge's scatter returns the first piece as given: what gloo would get.
    one_rank = types.SimpleNamespace(tp_size=1)
    pieces = list(torch.arange(12.0).reshape(3, 4).chunk(2, dim=1))

    def first_piece() -> torch.Tensor:
        return MegatronParamMapping.scatter_to_tp_ranks(
            one_rank, pieces, pieces[0].shape, torch.float32, torch.device("cpu")
        )

    assert not first_piece().is_contiguous()
    original = MegatronParamMapping.scatter_to_tp_ranks
    with cpu_compat.cpu_compat():
        patched = first_piece()
        replaced = MegatronParamMapping.scatter_to_tp_ranks is not original
    if cpu_compat.bridge_needs_contiguous_scatter():
        assert replaced and patched.is_contiguous() and torch.equal(patched, pieces[0])
    else:  # 0.6.x makes the pieces contiguous itself before its scatter: left alone
        assert not replaced and ".contiguous() for s in splits" in inspect.getsource(original)
    assert not first_piece().is_contiguous()


def test_patches_redirect_inside_the_block_and_are_undone_after():
    from megatron.core.tensor_parallel import random as mcore_random

    original_add = mcore_random.CudaRNGStatesTracker.add
    with cpu_compat.cpu_compat():
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.zeros(2).type() == "torch.cuda.FloatTensor"
        assert torch.cuda.current_device() == torch.device("cpu")
        assert mcore_random.CudaRNGStatesTracker.add is not original_add
    assert mcore_random.CudaRNGStatesTracker.add is original_add
    assert torch.zeros(2).type() == "torch.FloatTensor"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(2, device="cuda")


def test_te_placeholder_is_gone_after_the_bridge_compat():
    bridge = import_bridge()
    assert hasattr(bridge, "AutoBridge")
    assert "transformer_engine" not in sys.modules
    import megatron.core.extensions.transformer_engine as te_extension

    assert te_extension.HAVE_TE is False


def _as_range(prefix: str) -> str:
    major, minor = prefix.rstrip(".").split(".")
    return f">={major}.{minor},<{major}.{int(minor) + 1}"


def test_the_preflight_admits_exactly_the_lines_the_layer_supports():
    from hpcrl.plan.requirements import MEGATRON_CORE_ON_CPU, SUPPORTED

    (bridge,) = [row for row in SUPPORTED if row.module == "megatron.bridge"]
    for row, package in ((MEGATRON_CORE_ON_CPU, "megatron-core"), (bridge, "megatron-bridge")):
        wanted = " || ".join(_as_range(p) for p in cpu_compat.SUPPORTED_PREFIXES[package])
        assert row.spec == wanted, package


def test_a_nested_entry_leaves_the_outer_one_in_charge():
    from megatron.core.tensor_parallel import random as mcore_random

    original_add = mcore_random.CudaRNGStatesTracker.add
    with cpu_compat.cpu_compat(skip=frozenset({"cpu_rng_tracker"})):
        with cpu_compat.cpu_compat():  # e.g. a worker set up in a test rank that applied it
            assert mcore_random.CudaRNGStatesTracker.add is original_add  # the outer skip holds
            assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.zeros(2, device="cuda").device.type == "cpu"  # still on after the inner
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(2, device="cuda")
