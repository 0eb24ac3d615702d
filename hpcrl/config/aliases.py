"""NeMo RL's older section names, read as hpcrl's: ``policy.dtensor_cfg`` is ``policy.automodel_cfg``.

A true alias: the section is stored once, under the new name, and the old name stays
reachable for interpolation (``${policy.dtensor_cfg.tensor_parallel_size}`` works whichever
name the file used); problems are reported in the spelling the user wrote; the rename is
announced by one warning however many files (``defaults:``) or overrides use the old name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.config.errors import Problem

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: old dotted path -> new dotted path
ALIASES: dict[str, str] = {"policy.dtensor_cfg": "policy.automodel_cfg"}


def rename_in_file(data: dict[str, Any]) -> tuple[list[Problem], set[str]]:
    """Move old-named sections of one file to their new names, in place.

    Returns the problems (both names in one file) and the spellings the file used (old and/or
    new dotted paths), from which the loader decides how to report paths.
    """
    problems: list[Problem] = []
    spellings: set[str] = set()
    for old, new in ALIASES.items():
        parent = _parent(data, old)
        old_key, new_key = old.rsplit(".", 1)[1], new.rsplit(".", 1)[1]
        if parent is None:
            continue
        if new_key in parent:
            spellings.add(new)
        if old_key not in parent:
            continue
        if new_key in parent:
            del parent[old_key]  # reported here; the converter must not call it unknown too
            problems.append(
                Problem(
                    path=old,
                    message=f"both {old} and {new} are set",
                    fix=f"keep only {new} ({old_key} is NeMo RL's older name for it)",
                )
            )
        else:
            spellings.add(old)
            parent[new_key] = parent.pop(old_key)
    return problems, spellings


def rename_path(parts: tuple[str, ...]) -> tuple[str, ...]:
    """An override's key parts with an old-named prefix replaced by the new name."""
    for old, new in ALIASES.items():
        old_parts = tuple(old.split("."))
        if parts[: len(old_parts)] == old_parts:
            return tuple(new.split(".")) + parts[len(old_parts) :]
    return parts


def spellings_of(parts: tuple[str, ...]) -> set[str]:
    """The alias names (old or new dotted paths) that key ``parts`` starts with."""
    dotted = ".".join(parts)
    return {
        name
        for pair in ALIASES.items()
        for name in pair
        if dotted == name or dotted.startswith(name + ".")
    }


def alias_warning(old_path: str, new_path: str) -> Problem:
    old_name = old_path.split(".")[1]
    return Problem(
        path=old_path,
        message=f"{old_name} is NeMo RL's older name; read as {new_path}",
        fix=f"rename it to {new_path} (both names work in ${{...}})",
        severity="warning",
    )


def add_alias_nodes(cfg: DictConfig) -> None:
    """Make each old name an interpolation of the new one, so ``${old.x}`` resolves."""
    from omegaconf import OmegaConf

    for old, new in ALIASES.items():
        parent_key, old_key = old.rsplit(".", 1)
        parent = OmegaConf.select(cfg, parent_key, default=None)
        if OmegaConf.is_dict(parent) and OmegaConf.is_dict(parent._get_node(new.rsplit(".")[-1])):
            parent[old_key] = "${" + new + "}"


def is_alias_path(parts: tuple) -> bool:
    dotted = ".".join(str(part) for part in parts)
    return any(dotted == old or dotted.startswith(old + ".") for old in ALIASES)


def drop_alias_nodes(data: dict[str, Any]) -> None:
    """Remove what add_alias_nodes added (the section lives under its new name)."""
    for old in ALIASES:
        parent = _parent(data, old)
        if parent is not None:
            parent.pop(old.rsplit(".", 1)[1], None)


def spelled_as(spellings: Iterable[str]) -> dict[str, str]:
    """new path -> old path for sections the user wrote only under the old name."""
    used = set(spellings)
    return {new: old for old, new in ALIASES.items() if old in used and new not in used}


def respell_path(path: str, spelling: dict[str, str]) -> str:
    """A dotted path with a new section name written the way the user wrote it."""
    for new, old in spelling.items():
        if path == new or path.startswith(new + "."):
            return old + path[len(new) :]
    return path


def respell(problems: list[Problem], spelling: dict[str, str]) -> list[Problem]:
    """Problems with the new names written the way the user wrote them."""
    if not spelling:
        return problems
    pattern = re.compile("|".join(rf"\b{re.escape(new)}\b" for new in spelling))

    def fix_text(text: str) -> str:
        return pattern.sub(lambda match: spelling[match.group(0)], text)

    return [
        problem
        if spellings_of(tuple(problem.path.split("."))) - set(spelling)
        else attrs.evolve(
            problem,
            path=fix_text(problem.path),
            message=fix_text(problem.message),
            fix=fix_text(problem.fix),
        )
        for problem in problems
    ]


def _parent(data: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    node: Any = data
    for part in dotted.split(".")[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None
