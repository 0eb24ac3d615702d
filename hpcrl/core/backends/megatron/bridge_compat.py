"""megatron-bridge as hpcrl uses it, on both release lines (0.3.x: Python 3.11, CI; 0.6.x:
Python 3.12, the GPU machine) and without its optional NVIDIA packages.

The calls hpcrl makes (``AutoBridge.from_hf_pretrained``, ``to_megatron_provider``,
``provide_distributed_model``, ``export_hf_weights``, ``save_hf_pretrained``,
``yaml_utils.dump_dataclass_to_yaml``) keep their signatures from 0.3 to 0.6. What differs is
what they import: both lines need Transformer Engine to import at all, and 0.6.x's
``save_hf_pretrained`` needs NVIDIA ModelOpt. This module is the one place that knows.

Transformer Engine
------------------

megatron-bridge (0.3.x and 0.6.x alike) imports ``transformer_engine.pytorch`` at module level
in its LoRA code (``class TELinearAdapter(te.Linear)``), on the import path of ``AutoBridge``
itself (auto_bridge → model_bridge → peft_bridge → canonical_lora → lora_layers). So
``from megatron.bridge import AutoBridge`` fails on every machine without TE: the GPU test
machine, CPU machines, clusters whose image lacks TE. hpcrl uses none of the bridge's TE or
LoRA code: it builds the local layer spec when TE is absent (provider.py).

``import_bridge`` therefore imports the bridge with *placeholder* ``transformer_engine``
modules whose classes raise when anything instantiates them. They sit in ``sys.modules`` only
while the bridge imports and are removed right after, so megatron-core's own
``try: import transformer_engine`` probes (``HAVE_TE``, ``get_te_version``) keep seeing the
truth: the megatron-core modules that probe are imported first, and a check afterwards fails
loudly if any megatron-core module bound a placeholder. With real TE installed nothing is
replaced.

ModelOpt
--------
0.6.x's ``save_hf_weights`` imports ``modelopt.torch.quantization.utils.is_quantized`` before
writing anything, to write quantizer scales beside quantized weights. Without ModelOpt no
model can carry its quantizers, so ``save_hf_pretrained`` here answers that import with a
placeholder whose ``is_quantized`` is always False, for the duration of the call only.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

# megatron-core modules that probe for TE at import time; imported before the placeholder
# exists so that they see the real environment (no TE). Modules a megatron-core version does
# not have are skipped (0.16 and 0.19 differ); the check after the import catches any missed.
_CORE_MODULES_PROBING_TE = (
    "megatron.core.utils",
    "megatron.core.fp8_utils",
    "megatron.core.fp4_utils",
    "megatron.core.extensions.transformer_engine",
    "megatron.core.extensions.transformer_engine_spec_provider",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.gpt.moe_module_specs",
    "megatron.core.models.hybrid.hybrid_layer_specs",
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


class TransformerEngineMissing(RuntimeError):
    """Code tried to use a Transformer Engine class, but TE is not installed."""


class _Unavailable:
    """Base of every placeholder class: subclassing works, instantiating fails loudly."""

    def __init__(self, *args, **kwargs):
        raise TransformerEngineMissing(
            f"{type(self).__name__} needs Transformer Engine, which is not installed (hpcrl "
            "imported megatron-bridge with placeholders for it: "
            "hpcrl/core/backends/megatron/bridge_compat.py); install transformer-engine or "
            "use settings that do not need it"
        )


def transformer_engine_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def _placeholder_modules() -> dict[str, types.ModuleType]:
    # Any: the placeholders get attributes a plain ModuleType does not declare.
    te: Any = types.ModuleType("transformer_engine")
    te.__doc__ = "Placeholder (hpcrl bridge_compat.py): Transformer Engine is not installed."
    te_pytorch: Any = types.ModuleType("transformer_engine.pytorch")
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


def import_bridge() -> types.ModuleType:
    """``megatron.bridge`` (and its model bridges), imported with TE placeholders if TE is absent."""
    if "megatron.bridge" in sys.modules:
        return sys.modules["megatron.bridge"]
    if transformer_engine_installed():
        importlib.import_module("megatron.bridge.models")
        return importlib.import_module("megatron.bridge")
    assert "transformer_engine" not in sys.modules, "stale transformer_engine placeholder"
    for name in _CORE_MODULES_PROBING_TE:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is not None and _exists(name):
            importlib.import_module(name)
    placeholders = _placeholder_modules()
    sys.modules.update(placeholders)
    try:
        bridge = importlib.import_module("megatron.bridge")
        importlib.import_module("megatron.bridge.models")
    finally:
        for name in placeholders:
            sys.modules.pop(name, None)
    _check_core_holds_no_placeholder(placeholders)
    return bridge


def _exists(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package is missing in this megatron-core version
        return False


def _check_core_holds_no_placeholder(placeholders: dict[str, types.ModuleType]) -> None:
    """megatron-core must not have bound a placeholder: it would then take TE code paths."""
    fake_objects = {id(m) for m in placeholders.values()}
    for module in placeholders.values():
        fake_objects.update(id(v) for v in vars(module).values() if isinstance(v, type))
    fooled = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("megatron.core")
        and any(id(value) in fake_objects for value in vars(module).values())
    )
    if fooled:
        raise RuntimeError(
            f"megatron-core modules {fooled} were imported while hpcrl's Transformer Engine "
            "placeholder was installed and hold it (they would take Transformer Engine code "
            "paths); add them to _CORE_MODULES_PROBING_TE in "
            "hpcrl/core/backends/megatron/bridge_compat.py"
        )


def modelopt_installed() -> bool:
    return importlib.util.find_spec("modelopt") is not None


@contextlib.contextmanager
def _nothing_is_quantized_without_modelopt() -> Iterator[None]:
    if modelopt_installed():
        yield
        return
    names = ("modelopt", "modelopt.torch", "modelopt.torch.quantization")
    modules = {name: types.ModuleType(name) for name in names}
    utils: Any = types.ModuleType("modelopt.torch.quantization.utils")
    utils.__doc__ = "Placeholder (hpcrl bridge_compat.py): NVIDIA ModelOpt is not installed."
    utils.is_quantized = lambda model: False
    modules[utils.__name__] = utils
    assert not any(name in sys.modules for name in modules), "stale modelopt placeholder"
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name in modules:
            sys.modules.pop(name, None)


def save_hf_pretrained(bridge: Any, model_chunks: list, out_dir: str) -> None:
    """``bridge.save_hf_pretrained`` (config, tokenizer files and weights; every rank calls)."""
    with _nothing_is_quantized_without_modelopt():
        bridge.save_hf_pretrained(model_chunks, out_dir, show_progress=False)


_PEFT_TE_FLAGS = {
    "megatron.bridge.peft.module_matcher": (
        "HAVE_TE_COL_LINEAR", "HAVE_TE_LN_COL_LINEAR", "HAVE_TE_ROW_LINEAR", "HAVE_TE",
    ),
    "megatron.bridge.peft.utils": ("HAVE_TE",),
}  # fmt: skip


def import_bridge_lora() -> Any:
    """megatron-bridge's ``LoRA`` class. Without TE, megatron-core defines its TE linear names
    as ``MagicMock`` stand-ins, which the bridge's ``safe_import_from`` takes for the real
    classes (``HAVE_TE_COL_LINEAR`` True): its module matcher then calls ``isinstance`` with
    a MagicMock and fails (``TypeError: isinstance() arg 2 must be a type``) on every model.
    Without TE installed the flags are set to what they mean, no TE linear exists (0.3.x and
    0.6.x name them alike); with TE nothing changes."""
    import_bridge()
    import importlib

    if not transformer_engine_installed():
        for module_name, flags in _PEFT_TE_FLAGS.items():
            module = importlib.import_module(module_name)
            for flag in flags:
                if hasattr(module, flag):
                    setattr(module, flag, False)
    from megatron.bridge.peft.lora import LoRA

    return LoRA
