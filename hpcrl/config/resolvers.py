"""NeMo RL's arithmetic resolvers for ``${name:a,b}`` in recipes: add, sub, mul, div, max.

NeMo RL's example configs compute token budgets with them, e.g.
``train_mb_tokens: ${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}}``.
They mean what they mean there: Python's ``a + b``, ``a - b``, ``a * b``, ``a / b`` and
``max(a, b)``, on the two arguments as OmegaConf types them (``4`` an int, ``4.0`` a float, a
nested ``${...}`` the value it points at). One difference: ``div`` of two ints that divide
exactly is an int (NeMo RL gets ``64.0``), because hpcrl's integer keys refuse floats; an
inexact division stays a float and an integer key then says so with its key path.

OmegaConf keeps resolvers in one registry per process; they are registered on first use by
the loader, never at import. ``env_reads_recorded`` swaps OmegaConf's own ``oc.env`` for one
that also notes each name it reads, while the loader resolves, and puts it back.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Any


def _exact_int_division(a: Any, b: Any) -> Any:
    both_ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b))
    if both_ints and b != 0 and a % b == 0:
        return a // b
    return operator.truediv(a, b)


ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": _exact_int_division,
    "max": max,
}
#: OmegaConf's own resolvers that recipes may use, beside ARITHMETIC.
BUILT_IN = ("oc.env",)


def register_resolvers() -> None:
    """Make ARITHMETIC known to OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    for name, function in ARITHMETIC.items():
        if not OmegaConf.has_resolver(name):
            _register(name, _two_arguments(name, function))


def _register(name: str, resolver: Callable[..., Any], replace: bool = False) -> None:
    from omegaconf import OmegaConf

    if hasattr(OmegaConf, "register_resolver"):  # OmegaConf 2.4 (2.3 has only the old name)
        OmegaConf.register_resolver(name, resolver, replace=replace, annotation_validation="off")
    else:
        OmegaConf.register_new_resolver(name, resolver, replace=replace)


@contextlib.contextmanager
def env_reads_recorded() -> Iterator[list[str]]:
    """While open, every variable ``${oc.env:...}`` reads is appended to the list this yields,
    however its name was written (``${oc.env:"X"}``, ``${oc.env:${a.b}}``, a default's own
    ``${oc.env:Y}``, a resolver name built by interpolation): the name as OmegaConf read it."""
    from omegaconf.resolvers import oc

    reads: list[str] = []

    def env(*args: Any) -> Any:
        reads.append(str(args[0]) if args else "")
        return oc.env(*args)

    _register("oc.env", env, replace=True)
    try:
        yield reads
    finally:
        _register("oc.env", oc.env, replace=True)  # as OmegaConf registers it


def _two_arguments(name: str, function: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def resolve(*args: Any) -> Any:
        if len(args) != 2:
            raise ValueError(f"{name} takes two arguments, got {len(args)}: ${{{name}:a,b}}")
        try:
            return function(*args)
        except (TypeError, ZeroDivisionError) as error:
            raise ValueError(f"{name}({args[0]!r}, {args[1]!r}) failed: {error}") from None

    return resolve


def resolver_names() -> str:
    """The resolvers a recipe may use, for error messages."""
    return ", ".join(f"${{{name}:...}}" for name in (*ARITHMETIC, *BUILT_IN))
