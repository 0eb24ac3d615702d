"""hpcrl.config.shared_methods: the repr, eq and hash shared by the frozen config classes
behave as the ones attrs generates, and attrs generates none of them for those classes."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import attrs
import pytest

import hpcrl
from hpcrl.config import shared_methods
from hpcrl.config.shared_methods import SharedMethods


# The same fields twice: attrs generates the first class's methods, the second shares them.
@attrs.frozen(kw_only=True)
class Generated:
    a: int
    b: str = "x"
    hidden: int = attrs.field(default=1, repr=False)
    shown_short: int = attrs.field(default=12345, repr=lambda value: f"<{value % 100}>")
    ignored: int = attrs.field(default=0, eq=False)
    folded: str = attrs.field(default="ABC", eq=str.lower)
    items: tuple[Any, ...] = ()


@attrs.frozen(kw_only=True)
class Shared(SharedMethods):
    a: int
    b: str = "x"
    hidden: int = attrs.field(default=1, repr=False)
    shown_short: int = attrs.field(default=12345, repr=lambda value: f"<{value % 100}>")
    ignored: int = attrs.field(default=0, eq=False)
    folded: str = attrs.field(default="ABC", eq=str.lower)
    items: tuple[Any, ...] = ()


@attrs.frozen
class OwnRepr(SharedMethods):
    a: int

    def __repr__(self) -> str:
        return "mine"


CASES = [
    ({"a": 1}, {"a": 1}),
    ({"a": 1}, {"a": 2}),
    ({"a": 1, "ignored": 5}, {"a": 1, "ignored": 6}),
    ({"a": 1, "folded": "Ab"}, {"a": 1, "folded": "aB"}),
    ({"a": 1, "folded": "Ab"}, {"a": 1, "folded": "ac"}),
    ({"a": 1, "items": (1, (2, "z"))}, {"a": 1, "items": (1, (2, "z"))}),
    ({"a": float("nan")}, {"a": float("nan")}),
]


@pytest.mark.parametrize(("left", "right"), CASES)
def test_the_shared_methods_answer_as_the_generated_ones(left, right):
    generated = Generated(**left), Generated(**right)
    shared = Shared(**left), Shared(**right)
    assert repr(shared[0]).replace("Shared(", "Generated(") == repr(generated[0])
    assert (shared[0] == shared[1]) == (generated[0] == generated[1])
    assert (shared[0] != shared[1]) == (generated[0] != generated[1])
    if generated[0] == generated[1]:
        assert hash(shared[0]) == hash(shared[1])
    assert shared[0] != generated[0] and shared[0].__eq__(generated[0]) is NotImplemented


def test_repr_of_an_object_inside_itself_and_unhashable_fields():
    generated_list: list[Any] = []
    shared_list: list[Any] = []
    generated = Generated(a=1, items=(generated_list,))
    shared = Shared(a=1, items=(shared_list,))
    generated_list.append(generated)
    shared_list.append(shared)
    expected = "Generated(a=1, b='x', shown_short=<45>, ignored=0, folded='ABC', items=([...],))"
    assert repr(generated) == expected
    assert repr(shared) == expected.replace("Generated(", "Shared(")
    with pytest.raises(TypeError, match="unhashable"):
        hash(Generated(a=[1]))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unhashable"):
        hash(Shared(a=[1]))  # type: ignore[arg-type]


def test_a_method_the_class_writes_itself_stays():
    assert repr(OwnRepr(a=1)) == "mine" and OwnRepr(a=1) == OwnRepr(a=1)


def _hpcrl_modules() -> list[str]:
    """Every module of the stages that use SharedMethods (none imports a heavy library)."""
    names = []
    for package in ("config", "run", "plan"):
        path = [f"{hpcrl.__path__[0]}/{package}"]
        names += [f"hpcrl.{package}.{info.name}" for info in pkgutil.iter_modules(path)]
    return names


def test_every_class_using_them_is_frozen_and_attrs_generated_none_of_them():
    for name in _hpcrl_modules():
        importlib.import_module(name)
    classes = _subclasses(SharedMethods)
    assert len(classes) > 90  # the recipe, the profile, the job spec, the plan's records
    for cls in classes:
        assert attrs.has(cls), cls
        for method_name, method in shared_methods.SHARED:
            assert cls.__dict__[method_name] is method or method_name in _written_by(cls), cls
        blank = object.__new__(cls)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):  # a mutable class: unhashable
            blank.any_name = None  # a frozen class refuses every attribute


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    # attrs' slotted copy replaces the class it was made from: keep what the module names
    return [
        sub
        for sub in found
        if sub.__module__.startswith("hpcrl.")
        and getattr(sys.modules[sub.__module__], sub.__qualname__, None) is sub
    ]


def _written_by(cls: type) -> set[str]:
    """The methods the class body wrote itself (found in its source)."""
    import inspect

    source = inspect.getsource(cls)
    return {name for name, _ in shared_methods.SHARED if f"def {name}(" in source}
