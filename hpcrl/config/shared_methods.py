"""``__repr__``, ``__eq__`` and ``__hash__`` written once for hpcrl's frozen attrs classes.

attrs writes these three as Python source per class and compiles it when the class is
created: over the ~95 classes a ``hpcrl validate`` imports, that was ~2/3 of the 200 KB of
source compiled at start-up (~25 ms of a ~250 ms command here, more on a slower login node;
docs/performance.md, item 6). A class that subclasses ``SharedMethods`` gets these generic
versions as its *own* attributes (``__init_subclass__``), so ``attrs.frozen`` leaves them
alone: its ``auto_detect`` (on by default for ``attrs.define``/``attrs.frozen``, public API
since attrs 20.1) skips every method a class defines itself. attrs still writes
``__init__`` (validators, defaults, converters), so construction is unchanged.

They behave as attrs' own: the same repr text (``Name(a=1, b='x')``, ``...`` for an object
inside itself), equality only between instances of the same class comparing the fields attrs
compares (``eq``, ``eq_key``), and a hash of the fields attrs hashes (equal objects hash
equal). Only frozen classes may use it: attrs makes a mutable class with ``eq`` unhashable,
which this ``__hash__`` would undo (``tests/config/test_shared_methods.py`` checks both).
"""

from __future__ import annotations

import reprlib
from typing import Any

import attrs


class SharedMethods:
    """Base of a frozen attrs class: repr, eq and hash shared, not generated per class."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # On the class itself, not inherited: attrs' auto_detect only sees own attributes.
        # A method the class body writes itself stays (as attrs would keep it); attrs'
        # slotted copy of the class runs this again and finds them set.
        for name, method in SHARED:
            if name not in cls.__dict__:
                setattr(cls, name, method)


@reprlib.recursive_repr()  # attrs' generated repr also says "..." for an object inside itself
def _shared_repr(self: Any) -> str:
    shown = []
    for field in attrs.fields(self.__class__):
        if field.repr is False:
            continue
        value = getattr(self, field.name)
        text = repr(value) if field.repr is True else field.repr(value)
        shown.append(f"{field.name}={text}")
    # attrs' own spelling of the class name (a class defined in a function keeps its name)
    name = self.__class__.__qualname__.rsplit(">.", 1)[-1]
    return f"{name}({', '.join(shown)})"


def _shared_eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    for field in attrs.fields(self.__class__):
        if not field.eq:
            continue
        mine, theirs = getattr(self, field.name), getattr(other, field.name)
        if field.eq_key is not None:
            mine, theirs = field.eq_key(mine), field.eq_key(theirs)
        if not mine == theirs:
            return False
    return True


def _shared_hash(self: Any) -> int:
    values = []
    for field in attrs.fields(self.__class__):
        # attrs hashes a field with hash=True, or with hash unset and eq on
        if field.hash is True or (field.hash is None and field.eq):
            value = getattr(self, field.name)
            values.append(value if field.eq_key is None else field.eq_key(value))
    return hash((self.__class__, *values))


SHARED = (("__repr__", _shared_repr), ("__eq__", _shared_eq), ("__hash__", _shared_hash))
