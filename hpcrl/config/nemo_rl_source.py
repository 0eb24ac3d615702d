"""NeMo RL's config classes read from its source, never imported: the keys it defines and the
defaults it declares (used only to build the shipped key registry, ``nemo_rl_keys_build``).

NeMo RL describes its YAML with ``TypedDict`` classes (v0.5.0) and, since v0.7.0, partly with
pydantic ``BaseModel`` classes that carry defaults. This module parses every ``nemo_rl/**/*.py``
file with ``ast`` (NeMo RL imports torch and Ray at import time; reading is all we need) and
walks the config tree from the ``MasterConfig`` of ``nemo_rl/algorithms/grpo.py`` and
``sft.py``. A field typed with a config class contributes that class's fields and those of
every subclass of it (``GenerationConfig`` is read as ``VllmConfig`` and the other backends'
configs); a union contributes each member's; ``dict[str, X]`` is a free-form mapping (its keys
are the user's).

Where a default comes from is part of each record (``SourceKey.default_from``):
``pydantic default`` (the field's ``= value`` or ``Field(default=...)``), or ``absent`` for a
``NotRequired`` field (NeMo RL reads it with ``.get``; leaving it out is its default).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.shared_methods import SharedMethods

ROOTS = ("nemo_rl/algorithms/grpo.py", "nemo_rl/algorithms/sft.py")
ROOT_CLASS = "MasterConfig"
CONFIG_BASES = frozenset({"TypedDict", "BaseModel"})
WRAPPERS = frozenset({"NotRequired", "Required", "Optional", "Annotated", "ReadOnly"})
NO_DEFAULT = "<none>"


@attrs.frozen
class ClassInfo(SharedMethods):
    """One config class: its module (repository path), bases and annotated fields."""

    name: str
    module: str
    bases: tuple[str, ...]
    fields: tuple[FieldInfo, ...]
    total: bool = True  # TypedDict(total=False): every field NotRequired
    imports: dict[str, str] = attrs.field(factory=dict, eq=False)  # name -> dotted module


@attrs.frozen
class FieldInfo(SharedMethods):
    name: str
    annotation: ast.expr = attrs.field(eq=False)
    not_required: bool
    default: Any = NO_DEFAULT  # a literal the source declares, or NO_DEFAULT
    default_factory: str | None = None  # Field(default_factory=Cls): Cls's own defaults


@attrs.frozen
class SourceKey(SharedMethods):
    """A dotted key path NeMo RL's classes define, where, and its declared default."""

    path: str
    defined_in: str  # "nemo_rl/models/policy/__init__.py:PolicyConfig"
    not_required: bool
    default: Any = NO_DEFAULT
    default_from: str = ""  # "pydantic default" | "absent (NotRequired)" | ""
    free_form: bool = False  # dict[str, ...]: any key below is the user's
    nullable: bool = False  # the annotation admits None


def read_classes(root: Path) -> dict[str, list[ClassInfo]]:
    """Every class of ``root/nemo_rl`` whose bases include a config base, by name."""
    classes: dict[str, list[ClassInfo]] = {}
    for path in sorted((root / "nemo_rl").rglob("*.py")):
        module = str(path.relative_to(root))
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        imports = _imports(tree)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                info = _class_info(node, module, imports)
                classes.setdefault(info.name, []).append(info)
    names = _config_class_names(classes)
    return {name: infos for name, infos in classes.items() if name in names}


def _config_class_names(classes: dict[str, list[ClassInfo]]) -> set[str]:
    """Names of classes deriving (transitively) from TypedDict or BaseModel."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, infos in classes.items():
            if name in found:
                continue
            if any(set(info.bases) & (CONFIG_BASES | found) for info in infos):
                found.add(name)
                changed = True
    return found


def _imports(tree: ast.Module) -> dict[str, str]:
    """``from nemo_rl.x import Y`` -> {"Y": "nemo_rl.x"} (top-level imports only)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return found


def _class_info(node: ast.ClassDef, module: str, imports: dict[str, str]) -> ClassInfo:
    bases = tuple(_name_of(base) for base in node.bases)
    total = not any(
        kw.arg == "total" and isinstance(kw.value, ast.Constant) and kw.value.value is False
        for kw in node.keywords
    )
    fields = tuple(
        _field_info(stmt)
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    )
    return ClassInfo(
        name=node.name, module=module, bases=bases, fields=fields, total=total, imports=imports
    )


def _field_info(stmt: ast.AnnAssign) -> FieldInfo:
    assert isinstance(stmt.target, ast.Name)
    annotation = stmt.annotation
    not_required = _outer_name(annotation) == "NotRequired"
    default, factory = NO_DEFAULT, None
    value = stmt.value
    if value is not None:
        if isinstance(value, ast.Call) and _name_of(value.func) == "Field":
            for kw in value.keywords:
                if kw.arg == "default":
                    default = _literal(kw.value)
                elif kw.arg == "default_factory":
                    factory = _name_of(kw.value)
            if value.args:
                default = _literal(value.args[0])
        else:
            default = _literal(value)
    return FieldInfo(
        name=stmt.target.id,
        annotation=annotation,
        not_required=not_required,
        default=default,
        default_factory=factory,
    )


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return NO_DEFAULT


def _name_of(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name_of(node.value)
    return ""


def _outer_name(annotation: ast.expr) -> str:
    return _name_of(annotation.value) if isinstance(annotation, ast.Subscript) else ""


# --------------------------------------------------------------------------- the key tree
def source_keys(root: Path) -> list[SourceKey]:
    """Every key path below the GRPO and SFT ``MasterConfig`` s of the source at ``root``."""
    classes = read_classes(root)
    subclasses = _subclasses(classes)
    keys: dict[str, SourceKey] = {}
    for module in ROOTS:
        masters = [info for info in classes.get(ROOT_CLASS, []) if info.module == module]
        for master in masters:
            for key in _walk([master], "", classes, subclasses, ()):
                keys.setdefault(key.path, key)
    return sorted(keys.values(), key=lambda key: key.path)


def resolve(name: str, user: ClassInfo, classes: dict[str, list[ClassInfo]]) -> list[ClassInfo]:
    """The classes ``name`` means where ``user`` is defined: its own module's, else the module
    it imports the name from, else every class of that name."""
    candidates = classes.get(name, [])
    if len(candidates) <= 1:
        return candidates
    same = [info for info in candidates if info.module == user.module]
    if same:
        return same
    dotted = user.imports.get(name)
    if dotted:
        prefix = dotted.replace(".", "/")
        imported = [
            info
            for info in candidates
            if info.module == prefix + ".py" or info.module.startswith(prefix + "/")
        ]
        if imported:
            return imported
    return candidates


def _subclasses(classes: dict[str, list[ClassInfo]]) -> dict[str, set[str]]:
    children: dict[str, set[str]] = {}
    for name, infos in classes.items():
        for info in infos:
            for base in info.bases:
                children.setdefault(base, set()).add(name)
    return children


def _family(name: str, subclasses: dict[str, set[str]]) -> list[str]:
    """``name`` and every class deriving from it, in a stable order."""
    seen: list[str] = []
    todo = [name]
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.append(current)
        todo += sorted(subclasses.get(current, ()))
    return seen


def _all_fields(info: ClassInfo, classes: dict[str, list[ClassInfo]]) -> Iterator[FieldInfo]:
    """The class's own fields and its config bases' (TypedDict/BaseModel inheritance)."""
    for base in info.bases:
        for base_info in resolve(base, info, classes):
            yield from _all_fields(base_info, classes)
    for field in info.fields:
        yield field if info.total else attrs.evolve(field, not_required=True)


def _walk(
    infos: list[ClassInfo],
    prefix: str,
    classes: dict[str, list[ClassInfo]],
    subclasses: dict[str, set[str]],
    stack: tuple[str, ...],
) -> Iterator[SourceKey]:
    for info in infos:
        if info.name in stack:
            continue  # a recursive config type
        for field in _all_fields(info, classes):
            path = prefix + field.name
            sections, free_form = _sections_of(field.annotation, classes)
            optional = field.not_required
            default, default_from = field.default, ""
            if default is not NO_DEFAULT:
                default_from = "pydantic default"
            elif optional:
                default_from = "absent (NotRequired)"
            yield SourceKey(
                path=path,
                defined_in=f"{info.module}:{info.name}",
                not_required=optional,
                default=default,
                default_from=default_from,
                free_form=free_form and not sections,
                nullable=_admits_none(field.annotation),
            )
            members = [
                member
                for section in sections
                for family_name in _family(section, subclasses)
                for member in resolve(family_name, info, classes)
            ]
            if members:
                yield from _walk(members, path + ".", classes, subclasses, stack + (info.name,))


def _sections_of(
    annotation: ast.expr, classes: dict[str, list[ClassInfo]]
) -> tuple[list[str], bool]:
    """(config class names the annotation holds, whether it is a free-form mapping)."""
    names: list[str] = []
    free_form = False
    for node in _type_members(annotation):
        name = _name_of(node)
        if name in classes:
            names.append(name)
        elif name in ("dict", "Dict", "Mapping", "Any"):
            free_form = True
    return names, free_form


def _admits_none(annotation: ast.expr) -> bool:
    """Whether the type (through NotRequired/Optional/unions, not into containers) has None."""
    if isinstance(annotation, ast.Constant):
        return annotation.value is None or (
            isinstance(annotation.value, str) and "None" in annotation.value
        )
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _admits_none(annotation.left) or _admits_none(annotation.right)
    if isinstance(annotation, ast.Subscript):
        outer = _name_of(annotation.value)
        if outer == "Optional":
            return True
        if outer in WRAPPERS or outer == "Union":
            inner = annotation.slice
            items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            return any(_admits_none(item) for item in items[: 1 if outer == "Annotated" else None])
    return False


def _type_members(annotation: ast.expr) -> Iterator[ast.expr]:
    """The alternatives of a type: through NotRequired[...], Optional[...], Union, ``|``;
    list[X] contributes nothing (a list's items have no key paths)."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        yield from _type_members(annotation.left)
        yield from _type_members(annotation.right)
        return
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            yield from _type_members(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            pass
        return
    if isinstance(annotation, ast.Subscript):
        outer = _name_of(annotation.value)
        inner = annotation.slice
        if outer in WRAPPERS or outer == "Union":
            items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            if outer == "Annotated":
                items = items[:1]
            for item in items:
                yield from _type_members(item)
            return
        yield annotation.value  # dict[...], list[...], Literal[...]: the outer name
        return
    yield annotation
