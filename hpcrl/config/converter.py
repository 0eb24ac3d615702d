"""The one cattrs converter: plain dicts (from YAML) ⇄ the frozen attrs config classes.

Strict on purpose: unknown keys are errors (with "did you mean"), ``true`` is not an int,
a number is not a string (YAML reads ``4:00:00`` as 14400), a string is not a list. Every
structuring error is collected and turned into a ``Problem`` with its full key path.
"""

from __future__ import annotations

import functools
import math
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)

from hpcrl.config.errors import NO_VALUE, ConfigError, Problem
from hpcrl.config.profile import ClusterProfile, GpuCount
from hpcrl.config.recipe import Recipe
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.config.structure_hooks import BadValue, KeyNote, register_container_hooks, type_name
from hpcrl.config.suggestions import did_you_mean

T = TypeVar("T")
PathParts = tuple[str | int, ...]


@attrs.frozen
class StructureIssue(SharedMethods):
    """A structuring problem plus what the loader needs to prune it and retry."""

    parts: PathParts
    problem: Problem
    field_type: Any = None  # the attrs field's declared type where known


@functools.cache
def converter() -> cattrs.Converter:
    """The application's converter, built on first use and never changed afterwards.

    Cached because each class's hooks are built on first use (structuring: the field
    handlers looked up, ``_attrs_class_hook``; unstructuring: a function
    cattrs compiles per class); rebuilding it for every load would pay that each time.
    """
    return build_converter()


def build_converter() -> cattrs.Converter:
    """Build a fresh converter with hpcrl's strict hooks (use ``converter()`` instead)."""
    strict = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    strict.register_structure_hook(bool, _structure_bool)
    strict.register_structure_hook(int, _structure_int)
    strict.register_structure_hook(float, _structure_float)
    strict.register_structure_hook(str, _structure_str)
    strict.register_structure_hook(typing.Any, _structure_any)
    strict.register_structure_hook_func(lambda type_: type_ == GpuCount, _structure_gpu_count)
    strict.register_structure_hook_func(lambda type_: type_ == bool | str, _structure_bool_or_str)
    register_attrs_class_hook(strict)
    register_container_hooks(strict)
    return strict


# --------------------------------------------------------------------------- attrs classes
def register_attrs_class_hook(strict: cattrs.Converter) -> None:
    """Structure every attrs class through ``_attrs_class_hook`` (one loop for all classes)
    instead of cattrs' generated function per class. ``strict`` must forbid extra keys and
    validate in detail (``hpcrl.config.converter.build_converter``): the hook always does."""
    assert strict.forbid_extra_keys and strict.detailed_validation
    codes: dict[str, types.CodeType] = {}  # annotation text -> compiled, for every class
    strict.register_structure_hook_factory(
        attrs.has, lambda cls: _attrs_class_hook(cls, strict, codes)
    )


def _attrs_class_hook(cls: type, strict: cattrs.Converter, codes: dict[str, types.CodeType]) -> Any:
    """What cattrs' generated structuring function for ``cls`` does (with
    ``forbid_extra_keys`` and ``detailed_validation``), as one loop over the fields: cattrs
    writes and compiles a function per class, ~0.5 ms each, ~20 ms at a command's first
    recipe (docs/performance.md, item 6). The same steps in the same order, so the same
    errors: each field's error noted with its name and type (``AttributeValidationNote``),
    a missing required key a ``KeyError`` there, unknown keys one ``ForbiddenExtraKeysError``,
    all raised together in a ``ClassValidationError``, as is a failure of ``cls(...)``
    itself. Handlers are looked up now, as cattrs does (nested classes built first).
    """
    if any(isinstance(field.type, str) for field in attrs.fields(cls)):
        resolve_field_types(cls, codes)  # `from __future__ import annotations`: types as text
    # (key, keyword, type, required, handler, note text) of each field __init__ takes
    steps = [
        (
            field.name,
            field.alias,
            field.type,
            field.default is attrs.NOTHING,
            _field_handler(field.type, strict),
            f"Structuring class {cls.__qualname__} @ attribute {field.name}",
        )
        for field in attrs.fields(cls)
        if field.init
    ]
    allowed = {key for key, *_ in steps}
    what = f"While structuring {cls.__name__}"

    def structure(value: Any, _: type) -> Any:
        given, errors = {}, []
        for key, keyword, field_type, required, handler, note in steps:
            if not required and key not in value:
                continue
            try:
                given[keyword] = handler(value[key], field_type)
            except Exception as exc:  # every field's error, reported with its key
                exc.__notes__ = [
                    *getattr(exc, "__notes__", []),
                    AttributeValidationNote(note, key, field_type),
                ]
                errors.append(exc)
        unknown = set(value.keys()) - allowed
        if unknown:
            errors.append(ForbiddenExtraKeysError("", cls, unknown))
        if errors:
            raise ClassValidationError(what, errors, cls)
        try:
            return cls(**given)
        except Exception as exc:
            raise ClassValidationError(what, [exc], cls)  # noqa: B904  (as cattrs raises it)

    return structure


def resolve_field_types(cls: type, codes: dict[str, types.CodeType]) -> None:
    """``attrs.resolve_types(cls)``, each distinct annotation text compiled once (``codes``)
    instead of once per field and class as ``typing.get_type_hints`` does (~5 ms of a
    validate here: docs/performance.md, item 6)."""
    if getattr(cls, "__attrs_types_resolved__", None) is cls:
        return
    hints = evaluated_annotations(cls, codes)
    if hints is None:
        attrs.resolve_types(cls)
        return
    for field in attrs.fields(cls):
        if field.name in hints:
            object.__setattr__(field, "type", hints[field.name])  # as attrs does: frozen
    cls.__attrs_types_resolved__ = cls  # type: ignore[attr-defined]


def evaluated_annotations(cls: type, codes: dict[str, types.CodeType]) -> dict[str, Any] | None:
    """``typing.get_type_hints(cls, include_extras=True)``: each class of the MRO's
    annotation texts evaluated in its module's namespace, then its own; None where
    get_type_hints would change a value further (None, text or a forward reference inside):
    that class is left to it."""
    hints = {}
    for base in reversed(cls.__mro__):
        annotations = base.__dict__.get("__annotations__", {})
        module = getattr(sys.modules.get(base.__module__), "__dict__", {})
        own = dict(vars(base)) if annotations else {}
        for name, text in annotations.items():
            if not isinstance(text, str):
                return None
            code = codes.get(text)
            if code is None:
                code = codes[text] = compile(text, "<annotation>", "eval")
            value = eval(code, own, module)  # get_type_hints' order: module names first
            if not _as_get_type_hints_leaves_it(value):
                return None
            hints[name] = value
    return hints


def _as_get_type_hints_leaves_it(value: Any) -> bool:
    if value is None or isinstance(value, str | typing.ForwardRef):
        return False
    if typing.get_origin(value) is typing.Literal:
        return True  # its arguments are values, texts among them
    return all(
        arg is Ellipsis or _as_get_type_hints_leaves_it(arg) for arg in typing.get_args(value)
    )


def _field_handler(field_type: Any, strict: cattrs.Converter) -> Any:
    try:
        return strict.get_structure_hook(field_type, cache_result=False)
    except RecursionError:  # a class holding itself: look it up when structuring
        return strict.structure


# --------------------------------------------------------------------------- public API
def structure_recipe(data: Mapping[str, Any]) -> Recipe:
    """A Recipe from a plain dict; raises ConfigError listing every structuring problem."""
    return _structure_or_raise(data, Recipe)


def structure_profile(data: Mapping[str, Any]) -> ClusterProfile:
    """A ClusterProfile from a plain dict; raises ConfigError listing every problem."""
    return _structure_or_raise(data, ClusterProfile)


def unstructure(obj: Any) -> dict[str, Any]:
    """A plain dict (tuples as lists) suitable for YAML or JSON."""
    return _to_plain(converter().unstructure(obj))


def try_structure(
    data: Mapping[str, Any], cls: type[T], prefix: PathParts = ()
) -> tuple[T | None, list[StructureIssue]]:
    """Structure ``data`` as ``cls``: (object, []) or (None, every issue found).

    ``prefix``: where ``data`` sits in the user's file, so issue paths are full paths.
    """
    if not isinstance(data, Mapping):
        problem = Problem(
            path="<top>",
            value=data,
            message=f"expected a mapping of keys to values, got {type_name(data)}",
            fix="the file must hold YAML keys at the top level (key: value)",
        )
        return None, [StructureIssue(parts=(), problem=problem)]
    root: Any = data
    for part in reversed(prefix):
        root = {part: root}
    try:
        return converter().structure(dict(data), cls), []
    except BaseValidationError as exc:
        return None, _issues_from(exc, prefix, root, cls)
    except BadValue as exc:
        return None, [_leaf_issue(exc, prefix, root, cls)]


def keys_outside_schema(data: Mapping[str, Any], cls: type) -> list[tuple[PathParts, Any]]:
    """The keys of ``data`` that ``cls`` does not hold, found as structuring meets them (it
    reads every section anyway): (the path of the schema section holding one, the key as
    written) for each; keys inside list items are left out (structuring reports those)."""
    try:
        converter().structure(dict(data), cls)
    except BaseValidationError as exc:
        return [(parts, key) for parts, key in _extra_keys(exc, ()) if not _in_list(parts)]
    except BadValue:
        pass
    return []


def _extra_keys(exc: BaseException, parts: PathParts) -> list[tuple[PathParts, Any]]:
    if isinstance(exc, ForbiddenExtraKeysError):
        return [(parts, key) for key in exc.extra_fields]
    if isinstance(exc, BaseValidationError):
        return [
            found
            for sub in exc.exceptions
            for found in _extra_keys(sub, _child_location(sub, parts)[0])
        ]
    return []


def _in_list(parts: PathParts) -> bool:
    return any(isinstance(part, int) for part in parts)


def format_path(parts: PathParts) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "<top>"


def value_at(data: Any, parts: PathParts) -> Any:
    """The raw value at ``parts`` in nested dicts/lists, or NO_VALUE."""
    for part in parts:
        if isinstance(part, int) and isinstance(data, list | tuple) and part < len(data):
            data = data[part]
        elif isinstance(data, Mapping) and part in data:
            data = data[part]
        else:
            return NO_VALUE
    return data


def _structure_or_raise(data: Mapping[str, Any], cls: type[T]) -> T:
    obj, issues = try_structure(data, cls)
    if obj is None:
        raise ConfigError([issue.problem for issue in issues])
    return obj


# --------------------------------------------------------------------------- error walking
def _issues_from(
    exc: BaseException, parts: PathParts, data: Any, field_type: Any
) -> list[StructureIssue]:
    if isinstance(exc, ForbiddenExtraKeysError):
        return [
            _unknown_key_issue(parts + (key,), data, exc.cl) for key in sorted(exc.extra_fields)
        ]
    if isinstance(exc, BaseValidationError):
        issues = []
        for sub in exc.exceptions:
            sub_parts, sub_type = _child_location(sub, parts)
            issues += _issues_from(sub, sub_parts, data, sub_type)
        return issues
    return [_leaf_issue(exc, parts, data, field_type)]


def _child_location(exc: BaseException, parts: PathParts) -> tuple[PathParts, Any]:
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, KeyNote):
            return parts + (note.key,), None
        if isinstance(note, IterableValidationNote):
            return parts + (note.index,), note.type
        name = getattr(note, "name", None)  # cattrs' AttributeValidationNote
        if name is not None:
            return parts + (name,), getattr(note, "type", None)
    return parts, None


def _unknown_key_issue(parts: PathParts, data: Any, cls: type) -> StructureIssue:
    known = [field.name for field in attrs.fields(cls)]
    guess = did_you_mean(str(parts[-1]), known)
    parent = format_path(parts[:-1]) if parts[:-1] else "the top level"
    fix = f"did you mean {format_path(parts[:-1] + (guess,))}?" if guess else ""
    if not fix:  # a key one level or more further down (policy.lr -> policy.optimizer.kwargs.lr)
        from hpcrl.config.key_index import keys_ending_like

        below = [f"{parent}.{path}" if parts[:-1] else path
                 for path in keys_ending_like(cls, (str(parts[-1]),), 0)]  # fmt: skip
        fix = f"did you mean {' or '.join(below)}?" if below else ""
    fix = fix or f"remove it; keys allowed under {parent}: {', '.join(known)}"
    problem = Problem(
        path=format_path(parts),
        value=value_at(data, parts),
        message=f"unknown key {parts[-1]!r}",
        fix=fix,
    )
    return StructureIssue(parts=parts, problem=problem)


def _leaf_issue(exc: BaseException, parts: PathParts, data: Any, field_type: Any) -> StructureIssue:
    path = format_path(parts)
    value = value_at(data, parts)
    if isinstance(exc, KeyError) and value is NO_VALUE:
        message, fix = "required key is missing", f"add {path}: <{_type_name_of(field_type)}>"
    elif isinstance(exc, BadValue):
        message, fix = exc.message, exc.fix.replace("{path}", path)
    elif _is_section(field_type) and not isinstance(value, Mapping):
        message = f"expected a section of keys (key: value), got {type_name(value)}"
        fix = f"write {path}: followed by indented keys" + (
            ", or remove it" if value is None else ""
        )
    else:
        message, fix = f"invalid value: {exc}", ""
    problem = Problem(path=path, value=value, message=message, fix=fix)
    return StructureIssue(parts=parts, problem=problem, field_type=field_type)


# --------------------------------------------------------------------------- helpers
def _to_plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _to_plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(item) for item in value]
    return value


def _is_section(type_: Any) -> bool:
    """An attrs class, or an optional one."""
    members = [arg for arg in typing.get_args(type_) if arg is not type(None)] or [type_]
    return any(isinstance(member, type) and attrs.has(member) for member in members)


def _type_name_of(type_: Any) -> str:
    if type_ is None:
        return "value"
    if attrs.has(type_):
        return "section"
    if isinstance(type_, type) and not isinstance(type_, types.GenericAlias):
        return type_.__name__
    return str(type_).replace("typing.", "")


# --------------------------------------------------------------------------- strict scalars
def _structure_bool(value: Any, _: type) -> bool:
    if isinstance(value, bool):
        return value
    raise BadValue(
        f"expected true or false, got {type_name(value)}", "set {path}: true or {path}: false"
    )


def _structure_bool_or_str(value: Any, _: type) -> bool | str:
    """A planned setting's value as the JobSpec records it (``MachineNeed.value``)."""
    if isinstance(value, (bool, str)):
        return value
    raise BadValue(f"expected true, false or text, got {type_name(value)}", "")


def _structure_int(value: Any, _: type) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        # 2.0 or 1e20 is not silently an integer: YAML wrote a float, maybe by mistake.
        whole = f"{int(value)}" if abs(value) < 1e15 else "a whole number"
        raise BadValue(
            f"expected an integer, got the number {value!r} (a float)",
            f"write it without a decimal point or exponent, e.g. {{path}}: {whole}",
        )
    raise BadValue(
        f"expected an integer, got {type_name(value)}",
        "set {path} to a whole number, e.g. {path}: 1",
    )


def _structure_gpu_count(value: Any, _: type) -> int | str:
    if value == "auto":
        return value
    if isinstance(value, str):
        raise BadValue(
            f"expected a number of GPUs or auto, got the string {value!r}",
            "set {path} to a whole number, or to auto (local profiles: count this machine's GPUs)",
        )
    return _structure_int(value, int)


def _structure_float(value: Any, _: type) -> float:
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is not None and math.isfinite(number):
        return number
    if number is not None:
        raise BadValue(
            f"expected a finite number, got {value!r}",
            "write a finite number, e.g. 0.5 or 1.0e-5 (null where the key allows it)",
        )
    raise BadValue(
        f"expected a number, got {type_name(value)}", "write a number, e.g. 0.5 or 1.0e-5"
    )


def _structure_str(value: Any, _: type) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number_as_text_error(value)
    raise BadValue(f"expected a string, got {type_name(value)}", 'quote the value: {path}: "..."')


def _number_as_text_error(value: float) -> str:
    if isinstance(value, int) and value >= 60:
        raise BadValue(
            f"expected a string, got the number {value} (YAML reads an unquoted H:MM:SS as a base-60 number)",
            'quote the value, e.g. {path}: "04:00:00"',
        )
    raise BadValue(
        f"expected a string, got the number {value}", f'quote the value: {{path}}: "{value}"'
    )


def _structure_any(value: Any, _: type) -> Any:
    return value
