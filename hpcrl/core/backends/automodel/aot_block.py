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
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hpcrl.core.generation.aot_precompiled import PrecompiledPieces

if TYPE_CHECKING:
    import torch


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
    precompiled.signature_of = BlockSignatures()
    return precompiled


class BlockSignatures:
    """``block_signature``, computed once per block and kind of call: a call that no kept
    compilation's guards accept (a build that failed, a kind of call that was tried) asks
    for it in every block's every call, and the block's repr, the arguments' pytree and the
    digest cost ~57 us a call, the cached lookup ~9 us (tiny Qwen2 block, one CPU core).
    Cached by what the signature reads of a call besides the block itself (``call_kind``);
    the block's structure is fixed once compiled (``apply_compile`` is the last step that
    changes a plain block)."""

    def __init__(self) -> None:
        # weak: the reference model's blocks go when it does
        self.by_block: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], str]] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self, call: Sequence[Any]) -> str:
        layer, args, kwargs = call
        kind = call_kind(layer, args, kwargs)
        if kind is None:  # an argument the kind cannot tell by value
            return block_signature(call)
        known = self.by_block.setdefault(layer, {})
        signature = known.get(kind)
        if signature is None:
            signature = known[kind] = block_signature(call)
        return signature


def call_kind(layer: Any, args: Any, kwargs: Any) -> tuple[Any, ...] | None:
    """Grad mode, train / eval mode, autocast and the arguments' kinds: equal for two calls
    of one block only when their ``block_signature`` is equal. None when an argument is
    neither a tensor, a plain value nor a tuple, list or dict of them (computed every time)."""
    import torch

    arguments = _argument_kinds((args, kwargs), torch.Tensor)
    if arguments is None:
        return None
    autocast = tuple(
        torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        for device in ("cpu", "cuda")
    )
    return (torch.is_grad_enabled(), layer.training, autocast, arguments)


_PLAIN_TYPES = (type(None), bool, int, float, str)


def _argument_kinds(value: Any, tensor: type[torch.Tensor]) -> Any:
    """What ``block_signature`` reads of ``value`` (its pytree structure, tensors' dtype,
    rank, device and requires_grad, plain values' type and repr), hashable; None if unknown.
    ``tensor``: ``torch.Tensor`` (torch is imported lazily here, once a call)."""
    if isinstance(value, tensor):
        return (value.dtype, value.dim(), value.device.type, value.requires_grad)
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return (kind, repr(value))
    if kind is tuple or kind is list:
        keys, items = None, value
    elif kind is dict and all(type(key) is str for key in value):
        keys, items = tuple(value), value.values()
    else:
        return None
    kinds = [kind, keys]
    for item in items:
        item_kind = _argument_kinds(item, tensor)
        if item_kind is None:
            return None
        kinds.append(item_kind)
    return tuple(kinds)


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
