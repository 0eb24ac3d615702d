"""YAML → merged plain dict → attrs objects, with every problem collected.

A file may name base files in ``defaults:`` (one path or a list, relative to the file; later
bases win, the file itself wins over its bases; deep merge, lists replaced whole).
``${a.b}`` interpolation is resolved after overrides, on the login node (``${oc.env:X}``
therefore reads the submitting shell). Per file, before merging: ``policy.dtensor_cfg`` is
renamed to ``automodel_cfg`` (with a warning) and relative ``data.train_path``/``val_path``
are made absolute against that file's folder, so a recipe that extends a shipped recipe still
finds the shipped data.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.config.converter import StructureIssue, format_path, try_structure, value_at
from hpcrl.config.data_paths import absolutize_data_files
from hpcrl.config.errors import Problem
from hpcrl.config.overrides import alias_warning, apply_overrides
from hpcrl.config.plain_yaml import read_plain_yaml, resolve_references

if TYPE_CHECKING:
    from omegaconf import DictConfig

DEFAULTS_KEY = "defaults"
MAX_PRUNE_ROUNDS = 6
DATA_PATH_KEYS = ("train_path", "val_path")


@attrs.frozen
class MergedConfig:
    """A file after defaults, overrides and interpolation.

    resolved: plain dict with ``${...}`` resolved (None when a problem stopped loading);
    raw: the same before resolution, to say where an interpolated bad value came from.
    """

    resolved: dict[str, Any] | None
    raw: dict[str, Any]
    problems: list[Problem]


def load_merged(path: Path, overrides: Sequence[str], schema: type) -> MergedConfig:
    """Read ``path`` with its ``defaults:``, apply overrides, resolve interpolation."""
    data, problems = _load_tree(path, chain=())
    if data is None:
        return MergedConfig(resolved=None, raw={}, problems=problems)
    # OmegaConf is imported only when needed: it is most of a cold `hpcrl render`.
    resolved = None if overrides else resolve_references(data)
    if resolved is not None:
        return MergedConfig(resolved=resolved, raw=data, problems=problems)
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(data)
    cfg, override_problems = apply_overrides(cfg, overrides, schema)
    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved, resolve_problems = _resolve(cfg)
    return MergedConfig(
        resolved=resolved, raw=raw, problems=problems + override_problems + resolve_problems
    )


def name_interpolation_sources(
    issues: list[StructureIssue], raw: dict[str, Any]
) -> list[StructureIssue]:
    """Say where a bad value came from when it was written as ``${...}`` somewhere else."""
    named = []
    for issue in issues:
        written = value_at(raw, issue.parts)
        if isinstance(written, str) and "${" in written:
            message = f"{issue.problem.message} (the value comes from {written})"
            issue = attrs.evolve(issue, problem=attrs.evolve(issue.problem, message=message))
        named.append(issue)
    return named


def structure_leniently(data: dict[str, Any], cls: type) -> tuple[Any, list[StructureIssue]]:
    """Structure ``data``; on failure also return an object built from a pruned copy.

    The pruned object (bad keys dropped, required ones given placeholders) lets the rules run
    too, so a user sees structure errors and rule violations in one round. It is never used
    for anything but checking.
    """
    obj, issues = try_structure(data, cls)
    if obj is not None:
        return obj, []
    pruned = copy.deepcopy(data)
    round_issues = issues
    for _ in range(MAX_PRUNE_ROUNDS):
        for issue in round_issues:
            _prune(pruned, issue)
        obj, round_issues = try_structure(pruned, cls)
        if obj is not None:
            break
    return obj, issues


def _prune(data: dict[str, Any], issue: StructureIssue) -> None:
    parts = issue.parts
    first_index = next((i for i, part in enumerate(parts) if isinstance(part, int)), None)
    if first_index is not None:
        parts = parts[:first_index]  # drop a whole list field: every list has a default
    if not parts:
        return
    parent = data
    for part in parts[:-1]:
        parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            return
    key = parts[-1]
    if key in parent and issue.problem.message != "required key is missing":
        del parent[key]
    else:
        parent[key] = _placeholder(issue.field_type)


def _placeholder(field_type: Any) -> Any:
    if attrs.has(field_type):
        return {}
    return {str: "<missing>", int: 1, float: 1.0, bool: False}.get(field_type)


# --------------------------------------------------------------------------- files and defaults
def _load_tree(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any] | None, list[Problem]]:
    data, problems = _read_yaml(path)
    if data is None:
        return None, problems
    base_names = data.pop(DEFAULTS_KEY, None)
    problems += _normalise_file(data, path)
    merged: dict[str, Any] = {}
    for base_path, problem in _base_paths(base_names, path):
        if problem is not None:
            problems.append(problem)
        elif base_path in chain or base_path == path:
            problems.append(
                _defaults_problem(path, base_path, "defaults form a cycle", "remove the cycle")
            )
        else:
            base_data, base_problems = _load_tree(base_path, chain + (path,))
            problems += base_problems
            merged = deep_merge(merged, base_data or {})
    return deep_merge(merged, data), problems


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` over ``base``: mappings merge key by key, anything else (lists too) replaces."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_yaml(path: Path) -> tuple[dict[str, Any] | None, list[Problem]]:
    try:
        data = read_plain_yaml(path)
        if data is None:
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except FileNotFoundError:
        return None, [Problem(path=str(path), message="file not found", fix="check the path")]
    except Exception as exc:  # yaml.YAMLError and OmegaConf errors: the parser's own words
        message = " ".join(str(exc).split())
        return None, [
            Problem(path=str(path), message=f"not valid YAML: {message}", fix="fix the YAML syntax")
        ]
    if not isinstance(data, dict):
        return None, [
            Problem(
                path=str(path),
                message="must hold keys at the top level",
                fix="write key: value lines",
            )
        ]
    return data, []


def _base_paths(base_names: Any, path: Path) -> list[tuple[Path | None, Problem | None]]:
    if base_names is None:
        return []
    names = [base_names] if isinstance(base_names, str) else base_names
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        message = "must be a file name or a list of file names"
        return [
            (None, _defaults_problem(path, base_names, message, "write defaults: base/grpo.yaml"))
        ]
    return [_base_path(name, path) for name in names]


def _base_path(name: str, path: Path) -> tuple[Path | None, Problem | None]:
    base_path = Path(os.path.normpath(path.parent / Path(name).expanduser()))
    if not base_path.suffix:
        base_path = base_path.with_suffix(".yaml")
    if base_path.is_file():
        return base_path, None
    fix = "base names are relative to the file that lists them"
    return None, _defaults_problem(path, name, f"base file not found: {base_path}", fix)


def _defaults_problem(path: Path, value: Any, message: str, fix: str) -> Problem:
    return Problem(path=f"{DEFAULTS_KEY} (in {path})", value=str(value), message=message, fix=fix)


def _normalise_file(data: dict[str, Any], path: Path) -> list[Problem]:
    problems = _rename_alias(data)
    section = data.get("data")
    if isinstance(section, dict):
        for key in DATA_PATH_KEYS:
            value = section.get(key)
            if isinstance(value, str) and "${" not in value:
                section[key] = _absolute(value, path.parent)
        absolutize_data_files(section, path.parent)  # NeMo RL's prompt files and data sets
    return problems


def _rename_alias(data: dict[str, Any]) -> list[Problem]:
    policy = data.get("policy")
    if not isinstance(policy, dict) or "dtensor_cfg" not in policy:
        return []
    if "automodel_cfg" in policy:
        del policy["dtensor_cfg"]  # reported here; the converter must not call it unknown too
        return [
            Problem(
                path="policy.dtensor_cfg",
                message="both policy.dtensor_cfg and policy.automodel_cfg are set",
                fix="keep only policy.automodel_cfg (dtensor_cfg is NeMo RL's older name for it)",
            )
        ]
    policy["automodel_cfg"] = policy.pop("dtensor_cfg")
    return [alias_warning("policy.dtensor_cfg", "policy.automodel_cfg")]


def _absolute(value: str, folder: Path) -> str:
    expanded = Path(value).expanduser()
    return str(expanded if expanded.is_absolute() else Path(os.path.normpath(folder / expanded)))


# --------------------------------------------------------------------------- interpolation
def _resolve(cfg: DictConfig) -> tuple[dict[str, Any] | None, list[Problem]]:
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True), []
    except OmegaConfBaseException:
        pass  # find every bad interpolation and every ???, not only the first one
    problems = []
    for parts, node in _leaf_nodes(cfg, ()):
        key = format_path(parts)
        try:
            OmegaConf.select(cfg, key, throw_on_missing=True)
        except MissingMandatoryValue:
            fix = f"set it, e.g. with the override {key}=VALUE"
            problems.append(
                Problem(
                    path=key,
                    value="???",
                    message="must be set (the recipe leaves it as ???)",
                    fix=fix,
                )
            )
        except OmegaConfBaseException as exc:
            message = " ".join(str(exc).split("\n")[0].split())
            problems.append(
                Problem(
                    path=key,
                    value=node._value(),
                    message=f"cannot resolve: {message}",
                    fix="point ${...} at an existing key (full dotted path from the top)",
                )
            )
    return None, problems


def _leaf_nodes(node: Any, parts: tuple) -> list[tuple[tuple, Any]]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig) and not node._is_interpolation():
        children = [(key, node._get_node(key)) for key in node.keys()]
    elif OmegaConf.is_list(node) and not node._is_interpolation():
        children = [(index, node._get_node(index)) for index in range(len(node))]
    else:
        return [(parts, node)]
    return [leaf for key, child in children for leaf in _leaf_nodes(child, parts + (key,))]
