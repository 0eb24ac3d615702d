"""torch.compile for the torch engine's small pieces (pointwise blocks, the sampler): one
compilation for every shape, and eager code when the compiler fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def compiled_piece(fn: Callable[..., Any], *, backend: Any = "inductor") -> Callable[..., Any]:
    """``fn`` through ``torch.compile(dynamic=True, fullgraph=True)``, falling back to ``fn``
    itself (with a warning) when compiling fails.

    Every size is a symbol from the first call on, and duck shaping is off while it compiles
    (two sizes equal at the first call, rows × heads and columns say, would otherwise become
    one symbol and the first unequal pair would recompile). A size that is 1 at a call still
    gets a compilation of its own unless the caller marks it unbacked
    (``torch._dynamo.decorators.mark_unbacked``).
    """
    import torch
    import torch.fx.experimental._config as fx_config

    chosen = {"fn": torch.compile(fn, dynamic=True, fullgraph=True, backend=backend)}

    def call(*args: Any) -> Any:
        # set and restored by hand: fx_config.patch costs the host several times as much,
        # at every call (the sampler's is one per token)
        duck_shape = fx_config.use_duck_shape
        fx_config.use_duck_shape = False
        try:
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

    return call
