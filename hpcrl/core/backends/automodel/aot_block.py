"""The Automodel worker's compiled decoder block, compiled ahead of time and kept in the
compile cache folder, so that a warm run's first forward and backward load it instead of
letting dynamo trace the block again (docs/performance.md, item 3, sixth session).

Inductor's caches spare a warm run the block's kernels, not dynamo's trace of it (1-2.5 s
of a warm first GRPO step on the H200). ``aot_compile`` of a function that calls the block
(the block an argument, so its parameters are graph inputs guarded through it, and every
block of the model runs the same compilation) saves the trace with its guards; the loaded
function supports autograd (its backward graph is compiled with it). One compilation per
kind of call: grad mode and autocast are part of the file's name (log-probs run under
``no_grad``, train with gradients), the guards reject any other call, which then goes
through the block's ordinary ``torch.compile``.

Only for blocks that are plain modules when the first call comes: FSDP's hooks and the
checkpoint wrapper are not traced into one graph here (``apply_compile``'s caller decides).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from hpcrl.core.generation.aot_precompiled import PrecompiledPieces


def block_call(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What is compiled: the block's call with its hooks (``_call_impl``: not the
    ``_compiled_call_impl`` that ``Module.__call__`` dispatches to, which is this)."""
    return layer._call_impl(*args, **kwargs)


class AheadOfTimeBlockCall:
    """A block's ``_compiled_call_impl``: the saved compilation whose guards accept the call,
    else ``fallback`` (the block's ordinary ``torch.compile``)."""

    def __init__(self, layer: Any, precompiled: PrecompiledPieces, fallback: Callable[..., Any]):
        self.layer = layer
        self.precompiled = precompiled
        self.fallback = fallback

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled = self.precompiled.matching((self.layer, args, kwargs))
        if compiled is None:
            return self.fallback(*args, **kwargs)
        return compiled(self.layer, args, kwargs)


def precompiled_blocks(backend: Any) -> PrecompiledPieces | None:
    """Shared by every block of a model (and by the reference model's): None when the job
    plans no compile cache (then nothing changes), as for the torch engine's pieces."""
    precompiled = PrecompiledPieces.for_piece(block_call, backend)
    if precompiled is None:
        return None
    precompiled.signature_of = block_signature
    return precompiled


def block_signature(call: Sequence[Any]) -> str:
    """The block's class, structure and versions, the arguments' kinds (tensors: dtype,
    rank, device, requires_grad; others: their repr), grad mode, train / eval mode and
    autocast: a call the guards of every kept compilation reject gets one of its own."""
    import torch
    import transformers
    from torch.utils._pytree import tree_flatten

    layer, args, kwargs = call
    leaves, spec = tree_flatten((args, kwargs))
    parts = [
        f"{type(layer).__module__}.{type(layer).__qualname__} transformers {transformers.__version__}",
        repr(layer),
        str(spec),
        f"grad={torch.is_grad_enabled()} training={layer.training}",
    ]
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            parts.append(f"autocast {device} {torch.get_autocast_dtype(device)}")
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append(f"T{leaf.dtype}/{leaf.dim()}/{leaf.device.type}/{leaf.requires_grad}")
        else:
            parts.append(f"{type(leaf).__name__}={leaf!r}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
