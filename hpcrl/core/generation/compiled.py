"""torch.compile for the torch engine's small pieces (pointwise blocks, the sampler): one
compilation for every shape, and eager code when the compiler fails.

A run's first call of a piece costs dynamo's trace even when Inductor's caches hold the
kernels (docs/performance.md, item 3: on the H200 most of a warm first step was dynamo
tracing, under symbolic shapes). With a compile cache folder (``TORCHINDUCTOR_CACHE_DIR``,
which hpcrl's jobs always set: ``hpcrl.plan.compile_cache``) a piece is therefore compiled
ahead of time at its first call (``torch.compile(...).aot_compile``) and saved there
(``aot_precompiled.py``); the next run loads it and only checks its guards: no trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def compiled_piece(
    fn: Callable[..., Any],
    *,
    backend: Any = "inductor",
    mark_for_compile: Callable[[Sequence[Any]], None] | None = None,
) -> Callable[..., Any]:
    """``fn`` through ``torch.compile(dynamic=True, fullgraph=True)``, falling back to ``fn``
    itself (with a warning) when compiling fails.

    Every size is a symbol from the first call on, and duck shaping is off while it compiles
    (two sizes equal at the first call, rows × heads and columns say, would otherwise become
    one symbol and the first unequal pair would recompile). A size that is 1 at a call still
    gets a compilation of its own unless the caller marks it unbacked
    (``torch._dynamo.decorators.mark_unbacked``).

    With Inductor and a compile cache folder, the compilations are the ahead-of-time ones
    saved in that folder (``aot_precompiled.PrecompiledPieces``): a call whose arguments
    pass a saved compilation's guards runs it; any other call goes through torch.compile
    as above.

    ``mark_for_compile(args)`` marks the arguments (``mark_unbacked``, say) for a compilation
    only: before a build or torch.compile, never before a kept compilation's guard check.
    Guards saved to a file lose a tensor's dimension marks, and newer torch (2.13) refuses a
    marked tensor against them ("_has_dynamo_dim_marking is present on runtime tensor but was
    absent at compile time"); guards built with a mark accept an unmarked tensor.
    """
    import torch
    import torch.fx.experimental._config as fx_config

    from hpcrl.core.generation.aot_precompiled import PrecompiledPieces

    chosen = {"fn": torch.compile(fn, dynamic=True, fullgraph=True, backend=backend)}
    precompiled = PrecompiledPieces.for_piece(fn, backend)
    if precompiled is not None and mark_for_compile is not None:
        precompiled.before_build = mark_for_compile
    if precompiled is not None:
        # An earlier run's compilations, loaded now rather than at the first call, under the
        # settings a call runs with (guards built under others reject the calls).
        duck_shape = fx_config.use_duck_shape
        fx_config.use_duck_shape = False
        try:
            precompiled.preload()
        finally:
            fx_config.use_duck_shape = duck_shape

    def call(*args: Any) -> Any:
        # set and restored by hand: fx_config.patch costs the host several times as much,
        # at every call (the sampler's is one per token)
        duck_shape = fx_config.use_duck_shape
        fx_config.use_duck_shape = False
        try:
            if precompiled is not None and chosen["fn"] is not fn:
                ready = precompiled.matching(args)
                if ready is not None:
                    return ready(*args)
            if mark_for_compile is not None:
                mark_for_compile(args)
            return chosen["fn"](*args)
        except Exception as error:  # any compiler failure
            if chosen["fn"] is fn:
                raise
            import warnings

            warnings.warn(f"{fn.__name__}: torch.compile failed ({error}); eager", stacklevel=2)
            chosen["fn"] = fn
            return fn(*args)
        finally:
            fx_config.use_duck_shape = duck_shape

    call.precompiled = precompiled  # type: ignore[attr-defined]  # what tests and benchmarks read
    return call
