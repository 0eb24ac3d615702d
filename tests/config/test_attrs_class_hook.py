"""hpcrl.config.converter's one structuring loop for every attrs class (``_attrs_class_hook``) answers exactly as
cattrs' generated function per class: the same objects, and on bad input the same error tree
(exception types, messages, notes with their field names and types), which the converter turns
into problems with their key paths."""

from __future__ import annotations

import importlib
import typing
from typing import Any, Literal

import attrs
import cattrs
import pytest

from hpcrl.config.converter import build_converter, evaluated_annotations, resolve_field_types
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from hpcrl.config.shared_methods import SharedMethods
from tests.config.test_shared_methods import _hpcrl_modules, _subclasses
from tests.recipe_builder import base_dict, with_keys


def _generated_converter() -> cattrs.Converter:
    """hpcrl's converter with cattrs' own per-class code generation back on top."""
    converter = build_converter()
    converter.register_structure_hook_factory(attrs.has, converter.gen_structure_attrs_fromdict)
    return converter


def _tree(exc: BaseException) -> Any:
    notes = [(str(note), getattr(note, "name", None), getattr(note, "type", None))
             for note in getattr(exc, "__notes__", [])]  # fmt: skip
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return ("extra", exc.cl, sorted(exc.extra_fields), notes)
    if isinstance(exc, cattrs.BaseValidationError):
        return (type(exc).__name__, str(exc), exc.cl, [_tree(sub) for sub in exc.exceptions], notes)
    return (type(exc).__name__, str(exc), notes)


def _outcome(converter: cattrs.Converter, data: Any, cls: type) -> Any:
    try:
        return ("ok", converter.structure(data, cls))
    except Exception as exc:
        return ("error", _tree(exc))


def _broken_recipes() -> list[Any]:
    missing = base_dict()
    del missing["policy"]["model_name"]
    return [
        base_dict(),
        missing,
        with_keys(base_dict(), policy__precison="bfloat16", cluster__gpus_per_node="eight"),
        with_keys(base_dict(), policy__megatron_cfg__optimizer__optimizer_ofload_fraction=0.5),
        with_keys(base_dict(), policy__train_micro_batch_size=True, gpro={}),
        with_keys(base_dict(), policy__optimizer="adam"),  # a section given as text
        with_keys(base_dict(), policy__optimizer=None),
        with_keys(base_dict(), policy__optimizer=[1, 2]),
        with_keys(base_dict(), policy__optimizer=7),  # not even a container: raised bare
        with_keys(base_dict(), policy__generation__stop_strings=["a", 3]),
        with_keys(base_dict(), env__env_vars={"A": [1]}),
        with_keys(base_dict(), grpo__max_num_steps=0),  # refused by the class's validator
    ]


@pytest.mark.parametrize("index", range(len(_broken_recipes())))
def test_recipes_structure_as_with_generated_functions(index):
    data = _broken_recipes()[index]
    ours, generated = build_converter(), _generated_converter()
    assert _outcome(ours, data, Recipe) == _outcome(generated, data, Recipe)


def test_profiles_and_a_non_mapping_top_structure_the_same():
    ours, generated = build_converter(), _generated_converter()
    for data, cls in [
        ({"name": "x", "scheduler": "slurm", "partiton": "a"}, ClusterProfile),
        ({"name": "x"}, ClusterProfile),
        ("text", Recipe),
        (None, ClusterProfile),
    ]:
        assert _outcome(ours, data, cls) == _outcome(generated, data, cls)


def test_the_converter_compiles_no_structuring_function(monkeypatch):
    compiled = []
    monkeypatch.setattr(cattrs.gen, "compile", lambda *a, **k: compiled.append(a) or compile(*a, **k),
                        raising=False)  # fmt: skip
    build_converter().structure(base_dict(), Recipe)
    assert compiled == []


def test_every_frozen_class_gets_the_field_types_get_type_hints_gives():
    """The hook resolves the annotation texts (``from __future__ import annotations``) by
    evaluating each distinct text once (``resolve_field_types``), not through
    ``typing.get_type_hints``, which compiles every one again: for every frozen class of
    hpcrl the same types, and nearly all of them without falling back to it."""
    for name in _hpcrl_modules():
        importlib.import_module(name)
    classes = _subclasses(SharedMethods)
    codes: dict[str, Any] = {}
    evaluated = [cls for cls in classes if evaluated_annotations(cls, codes) is not None]
    for cls in evaluated:
        assert evaluated_annotations(cls, codes) == typing.get_type_hints(cls, include_extras=True)
    assert len(evaluated) >= len(classes) - 3, sorted(set(classes) - set(evaluated), key=str)
    assert len(codes) < sum(len(cls.__annotations__) for cls in evaluated) / 2  # shared texts


class _Base:
    inherited: tuple[str, ...] = ()


def _pair() -> list[type]:
    """Two copies of one class, annotations as text, resolved each way below."""
    made = []
    for _ in range(2):

        @attrs.frozen
        class Sample(_Base):
            kind: Literal["a", "b"] = "a"
            count: int | None = None
            nested: dict[str, list[float]] = attrs.field(factory=dict)
            later: Later | None = None  # defined after the class: resolved when structured

        made.append(Sample)
    return made


@attrs.frozen
class Later:
    x: int = 0


def test_resolving_sets_the_fields_as_attrs_does():
    mine, theirs = _pair()
    assert all(isinstance(field.type, str) for field in attrs.fields(mine))
    resolve_field_types(mine, {})
    attrs.resolve_types(theirs)
    assert [f.type for f in attrs.fields(mine)] == [f.type for f in attrs.fields(theirs)]
    assert mine.__attrs_types_resolved__ is mine
    assert build_converter().structure({"later": {"x": 2}, "kind": "b"}, mine).later == Later(2)
