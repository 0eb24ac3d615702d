"""Test-only stand-in for Transformer Engine, just enough to *import* megatron-bridge on CPU.

Why: megatron-bridge 0.3.x imports ``transformer_engine.pytorch`` at module level in its LoRA
code (``class TELinearAdapter(te.Linear)``), so ``from megatron.bridge import AutoBridge``
fails on machines without TE (this CPU box; the H200 box has no TE either). Transformer
Engine itself cannot run here (it needs cuDNN/cuBLAS/NCCL).

What: fake ``transformer_engine`` / ``transformer_engine.pytorch`` modules whose classes
raise if anything ever instantiates them. They are placed in ``sys.modules`` only while
megatron-bridge is imported and removed right after, so megatron-core's own
``try: import transformer_engine`` probes (``HAVE_TE``) keep seeing the truth: no TE.
``import_bridge_without_te`` asserts that afterwards, loudly.
"""

from __future__ import annotations

import importlib
import sys
import types

# megatron-core modules that probe for TE at import time; imported first so that they see
# the real environment (no TE), not the stand-in.
_CORE_MODULES_PROBING_TE = (
    "megatron.core.fp8_utils",
    "megatron.core.fp4_utils",
    "megatron.core.extensions.transformer_engine",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.transformer.multi_latent_attention",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.inference.text_generation_controllers.text_generation_controller",
    "megatron.core.models.gpt.experimental_attention_variant_module_specs",
    "megatron.core.models.gpt.heterogeneous.heterogeneous_layer_specs",
    "megatron.core.models.multimodal.llava_model",
    "megatron.core.models.vision.clip_vit_model",
    "megatron.core.ssm.mamba_context_parallel",
    "megatron.core.transformer.heterogeneous.linear_replacements",
)


class _Unavailable:
    """Base of every stand-in class: subclassing works, instantiating fails loudly."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__} comes from the test-only Transformer Engine stand-in "
            "(tests/megatron/te_standin.py); real Transformer Engine is not installed"
        )


def _standin_modules() -> dict[str, types.ModuleType]:
    te = types.ModuleType("transformer_engine")
    te.__doc__ = "Test-only stand-in (tests/megatron/te_standin.py); not Transformer Engine."
    te_pytorch = types.ModuleType("transformer_engine.pytorch")
    te_ops = types.ModuleType("transformer_engine.pytorch.ops")
    for name in ("Linear", "LayerNormLinear", "LayerNorm", "RMSNorm"):
        setattr(te_pytorch, name, type(name, (_Unavailable,), {}))
    for name in (
        "Sequential",
        "Linear",
        "LayerNorm",
        "RMSNorm",
        "Quantize",
        "MakeExtraOutput",
        "Dropout",
        "AddExtraInput",
        "ConstantScale",
    ):
        setattr(te_ops, name, type(name, (_Unavailable,), {}))
    te_pytorch.ops = te_ops
    te.pytorch = te_pytorch
    return {
        "transformer_engine": te,
        "transformer_engine.pytorch": te_pytorch,
        "transformer_engine.pytorch.ops": te_ops,
    }


def import_bridge_without_te():
    """Import ``megatron.bridge`` (and the model bridges) with the stand-in; return the module."""
    if "megatron.bridge" in sys.modules:
        return sys.modules["megatron.bridge"]
    assert "transformer_engine" not in sys.modules, "real or stale transformer_engine present"
    for name in _CORE_MODULES_PROBING_TE:
        importlib.import_module(name)
    standins = _standin_modules()
    sys.modules.update(standins)
    try:
        bridge = importlib.import_module("megatron.bridge")
        importlib.import_module("megatron.bridge.models")
    finally:
        for name in standins:
            sys.modules.pop(name, None)
    _assert_core_holds_no_standin(standins)
    return bridge


def _assert_core_holds_no_standin(standins: dict[str, types.ModuleType]) -> None:
    """megatron-core must not have bound the stand-in: it would then take TE code paths."""
    fake_objects = {id(m) for m in standins.values()}
    for module in standins.values():
        fake_objects.update(id(v) for v in vars(module).values() if isinstance(v, type))
    fooled = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("megatron.core")
        and any(id(value) in fake_objects for value in vars(module).values())
    )
    assert not fooled, (
        f"megatron-core modules {fooled} were imported while the TE stand-in was installed and "
        "hold it (they would take Transformer Engine code paths); add them to "
        "_CORE_MODULES_PROBING_TE in tests/megatron/te_standin.py"
    )
