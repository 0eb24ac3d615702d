"""YAML → merged plain dict → attrs objects, with every problem collected in one pass.

A file may name base files in ``defaults:`` (one path or a list; later bases win, the file
itself wins over its bases; deep merge, lists replaced whole; a section holding
``_override_: true`` replaces the bases' section instead of merging into it, as in NeMo RL).
A base name is looked up in the file's own folder first, then in the caller's search folders
(``BaseSearch``: for a profile the profile search path, which ends with the shipped profiles;
for a recipe the shipped recipes), skipping the file itself, so ``eos.yaml`` on the search
path may extend the shipped ``eos.yaml``. Keys in ``BaseSearch.own_keys`` (a profile's
``name``) are never inherited from a base. One reader for every file: hpcrl's YAML loader,
which reads as OmegaConf's does (``hpcrl.config.yaml_loader``), and OmegaConf's interpolation
(``${a.b}``, ``${oc.env:X}``, NeMo RL's ``${mul:a,b}`` and the other resolvers of
``hpcrl.config.resolvers``), resolved after overrides, on the login node (``${oc.env:X}``
therefore reads the submitting shell). Per file, before merging: ``policy.dtensor_cfg`` is
moved to ``automodel_cfg`` (``hpcrl.config.aliases``) and relative ``data.train_path``/
``val_path`` are made absolute against that file's folder, so a recipe that extends a shipped
recipe still finds the shipped data. A merged config with no overrides and nothing for
OmegaConf to do (``hpcrl.config.plain_config``) is returned as read, omegaconf not imported.

An interpolation that cannot be resolved is reported and its key left out, so the schema and
the rules still check everything else: all problems come in one round. So is a key whose
resolution reads a secret-named variable (``MergedConfig.secret_reads``: what ``oc.env``
really read, however the text names it), its value never seen past this module.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.config import aliases
from hpcrl.config.converter import PathParts, StructureIssue, format_path, try_structure, value_at
from hpcrl.config.data_paths import absolutize_data_files
from hpcrl.config.deep_merge import deep_merge
from hpcrl.config.errors import Problem
from hpcrl.config.interpolation_size import oversized_values
from hpcrl.config.locate import non_file_kind
from hpcrl.config.overrides import apply_overrides
from hpcrl.config.plain_config import is_plain, plain_copies
from hpcrl.config.resolvers import env_reads_recorded, register_resolvers, resolver_names
from hpcrl.config.secrets import is_secret_name
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.config.yaml_limits import yaml_size_problem
from hpcrl.config.yaml_text import dict_container

if TYPE_CHECKING:
    from omegaconf import DictConfig

DEFAULTS_KEY = "defaults"
DATA_PATH_KEYS = ("train_path", "val_path")


@attrs.frozen
class BaseSearch(SharedMethods):
    """Where ``defaults:`` names are looked up after the file's own folder, and the keys
    each file keeps to itself (a base never hands them down)."""

    folders: tuple[Path, ...] = ()
    own_keys: tuple[str, ...] = ()
    what: str = "file"  # "profile", "recipe": for messages


@attrs.frozen
class SecretRead(SharedMethods):
    """A key whose value, as resolved, came (wholly, in part, or through other keys) from a
    secret-named variable (``hpcrl.config.secrets.is_secret_name``); text: as written."""

    parts: PathParts
    name: str
    text: str


@attrs.frozen
class MergedConfig(SharedMethods):
    """A file after defaults, overrides and interpolation.

    resolved: plain dict with ``${...}`` resolved (None when a problem stopped loading), keys
    whose interpolation failed left out; raw: the same before resolution, to say where an
    interpolated bad value came from; unresolved: the key paths left out (already reported,
    or in ``secret_reads``); spelled_as: new section name -> the older name the user wrote it
    as (``aliases``); secret_reads: every key whose resolution read a secret-named variable
    (``SecretRead``), left out of ``resolved`` too: the caller reports them.
    """

    resolved: dict[str, Any] | None
    raw: dict[str, Any]
    problems: list[Problem]
    unresolved: tuple[PathParts, ...] = ()
    spelled_as: dict[str, str] = attrs.field(factory=dict)
    secret_reads: tuple[SecretRead, ...] = ()


def load_merged(
    path: Path,
    overrides: Sequence[str],
    schema: type,
    known: Callable[[tuple[str, ...]], bool] | None = None,
    search: BaseSearch = BaseSearch(),
    *,
    through_omegaconf: bool = False,
) -> MergedConfig:
    """Read ``path`` with its ``defaults:``, apply overrides, resolve interpolation.

    ``known``: keys outside ``schema`` that overrides may still set (see apply_overrides).
    ``search``: where base names are found besides the file's folder (``BaseSearch``).
    ``through_omegaconf``: build the ``DictConfig`` even for a plain config (for the tests
    that compare the two paths, ``hpcrl.config.plain_config``).
    """
    data, problems, spellings = _load_tree(path, chain=(), search=search)
    if data is None:
        return MergedConfig(resolved=None, raw={}, problems=problems)
    problems = _one_alias_warning(problems, spellings)
    if not overrides and not through_omegaconf and is_plain(data):
        resolved, raw = plain_copies(data)
        aliases.drop_alias_nodes(resolved)  # as OmegaConf's path: a leftover old name goes
        return MergedConfig(
            resolved=resolved, raw=raw, problems=problems, spelled_as=aliases.spelled_as(spellings)
        )
    return _merged_through_omegaconf(data, problems, spellings, overrides, schema, known)


def _merged_through_omegaconf(
    data: dict[str, Any],
    problems: list[Problem],
    spellings: set[str],
    overrides: Sequence[str],
    schema: type,
    known: Callable[[tuple[str, ...]], bool] | None,
) -> MergedConfig:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(data)
    cfg, override_problems, override_spellings = apply_overrides(cfg, overrides, schema, known)
    warned = {p.path for p in problems if not p.is_error}
    problems += [
        p
        for p in override_problems
        if p.is_error or not any(aliases.spellings_of(tuple(p.path.split("."))) & warned)
    ]
    raw = dict_container(cfg, resolve=False)
    aliases.add_alias_nodes(cfg)
    oversized = oversized_values(dict_container(cfg, resolve=False))
    resolved, resolve_problems, unresolved, secret_reads = _resolve(cfg, oversized)
    aliases.drop_alias_nodes(resolved)
    return MergedConfig(
        resolved=resolved,
        raw=raw,
        problems=problems + resolve_problems,
        unresolved=unresolved,
        spelled_as=aliases.spelled_as(spellings | override_spellings),
        secret_reads=secret_reads,
    )


def _one_alias_warning(problems: list[Problem], spellings: set[str]) -> list[Problem]:
    """However many files of a ``defaults:`` chain use an old name, say it once."""
    old_used = [old for old in aliases.ALIASES if old in spellings]
    return problems + [aliases.alias_warning(old, aliases.ALIASES[old]) for old in old_used]


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

    The pruned object (bad keys dropped, required ones given complete placeholders) lets the
    rules run too, so a user sees structure errors and rule violations in one round. It is
    never used for anything but checking; None if even the pruned copy does not structure.
    """
    obj, issues = try_structure(data, cls)
    if obj is not None:
        return obj, []
    pruned = copy.deepcopy(data)
    for issue in issues:
        _prune(pruned, issue)
    obj, _ = try_structure(pruned, cls)
    return obj, issues


def _prune(data: dict[str, Any], issue: StructureIssue) -> None:
    parts = issue.parts
    first_index = next((i for i, part in enumerate(parts) if isinstance(part, int)), None)
    if first_index is not None:
        parts = parts[:first_index]  # drop a whole list field: every list has a default
    if not parts:
        return
    parent: Any = data
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
    """A value of ``field_type`` that structures: attrs sections with their required keys."""
    if attrs.has(field_type):
        return {
            field.name: _placeholder(field.type)
            for field in attrs.fields(attrs.resolve_types(field_type))
            if field.default is attrs.NOTHING
        }
    return {str: "<missing>", int: 1, float: 1.0, bool: False}.get(field_type)


# --------------------------------------------------------------------------- files and defaults
def _load_tree(
    path: Path, chain: tuple[Path, ...], search: BaseSearch
) -> tuple[dict[str, Any] | None, list[Problem], set[str]]:
    """The file merged over its bases; its problems; the alias spellings its files used."""
    data, problems = _read_yaml(path)
    if data is None:
        return None, problems, set()
    base_names = data.pop(DEFAULTS_KEY, None)
    file_problems, spellings = _normalise_file(data, path)
    problems += file_problems
    merged: dict[str, Any] = {}
    for base_path, problem in _base_paths(base_names, path, search):
        if problem is not None:
            problems.append(problem)
        elif base_path in chain or base_path == path:
            problems.append(
                _defaults_problem(path, base_path, "defaults form a cycle", "remove the cycle")
            )
        else:
            assert base_path is not None  # _base_paths pairs a missing path with its problem
            base_data, base_problems, base_spellings = _load_tree(
                base_path, chain + (path,), search
            )
            problems += base_problems
            spellings |= base_spellings
            inherited = {k: v for k, v in (base_data or {}).items() if k not in search.own_keys}
            merged = deep_merge(merged, inherited)
    return deep_merge(merged, data), problems, spellings


def _read_yaml(path: Path) -> tuple[dict[str, Any] | None, list[Problem]]:
    from hpcrl.config.yaml_text import load_yaml

    try:
        too_large = yaml_size_problem(path)
        if too_large is not None:
            return None, [too_large]
        data = load_yaml(path)
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
    if not data:
        # An empty file would stand for "every default", which is never what was meant
        # (a profile of defaults is a GPU Slurm cluster nobody described).
        return None, [
            Problem(
                path=str(path),
                message="the file is empty",
                fix="write its keys, or start from a shipped file with defaults: <name>.yaml",
            )
        ]
    return data, []


def _base_paths(
    base_names: Any, path: Path, search: BaseSearch
) -> list[tuple[Path | None, Problem | None]]:
    if base_names is None:
        return []
    names = [base_names] if isinstance(base_names, str) else base_names
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        message = "must be a file name or a list of file names"
        return [
            (None, _defaults_problem(path, base_names, message, "write defaults: base/grpo.yaml"))
        ]
    return [_base_path(name, path, search) for name in names]


def _base_path(name: str, path: Path, search: BaseSearch) -> tuple[Path | None, Problem | None]:
    """The first existing candidate: the file's own folder, then the search folders (for a
    relative name that stays below them); never the file itself."""
    relative = Path(name).expanduser()
    folders = [path.parent]
    if not relative.is_absolute() and ".." not in relative.parts:
        folders += [folder for folder in search.folders if folder != path.parent]
    tried = []
    for folder in folders:
        given = Path(os.path.normpath(folder / relative))
        candidate = given if given.suffix else given.with_suffix(".yaml")
        tried.append(candidate)
        if candidate.is_file() and not _same_file(candidate, path):
            return candidate, None
        kind = non_file_kind(given) or non_file_kind(candidate)
        if kind is not None:  # `defaults: /dev/zero` is there, but no file
            shown = given if non_file_kind(given) else candidate
            fix = "name a YAML file (a base recipe or profile)"
            return None, _defaults_problem(path, name, f"{shown} is {kind}, not a YAML file", fix)
    where = ", ".join(str(candidate) for candidate in tried)
    fix = (
        f"a base name is looked up beside the file that lists it, then on the {search.what} "
        "search path; give an existing file (or an absolute path)"
        if search.folders
        else "base names are relative to the file that lists them"
    )
    return None, _defaults_problem(path, name, f"base file not found (looked for {where})", fix)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def _defaults_problem(path: Path, value: Any, message: str, fix: str) -> Problem:
    return Problem(path=f"{DEFAULTS_KEY} (in {path})", value=str(value), message=message, fix=fix)


def _normalise_file(data: dict[str, Any], path: Path) -> tuple[list[Problem], set[str]]:
    problems, spellings = aliases.rename_in_file(data)
    section = data.get("data")
    if isinstance(section, dict):
        for key in DATA_PATH_KEYS:
            value = section.get(key)
            if isinstance(value, str) and "${" not in value and "://" not in value:
                section[key] = _absolute(value, path.parent)
        absolutize_data_files(section, path.parent)  # NeMo RL's prompt files and data sets
    return problems, spellings


def _absolute(value: str, folder: Path) -> str:
    expanded = Path(value).expanduser()
    return str(expanded if expanded.is_absolute() else Path(os.path.normpath(folder / expanded)))


# --------------------------------------------------------------------------- interpolation
def _resolve(
    cfg: DictConfig, oversized: dict[PathParts, Problem | None]
) -> tuple[dict[str, Any], list[Problem], tuple[PathParts, ...], tuple[SecretRead, ...]]:
    """Every value resolved; keys that cannot be are reported and left out, and so are keys
    whose resolution reads a secret-named variable (returned as ``SecretRead``s, found by
    what ``${oc.env:...}`` really read, not by how the text looks), and keys whose resolved
    value would be too large to build (``oversized``, hpcrl.config.interpolation_size)."""
    from omegaconf.errors import OmegaConfBaseException

    register_resolvers()
    with env_reads_recorded() as reads:
        try:
            if not oversized:
                resolved = dict_container(cfg, resolve=True, throw_on_missing=True)
                if not any(is_secret_name(name) for name in reads):
                    return resolved, [], (), ()
        except (OmegaConfBaseException, RecursionError):
            pass  # find every bad interpolation and every ???, not only the first one
        return _resolve_by_leaf(cfg, reads, oversized)


def _resolve_by_leaf(
    cfg: DictConfig, reads: list[str], oversized: dict[PathParts, Problem | None]
) -> tuple[dict[str, Any], list[Problem], tuple[PathParts, ...], tuple[SecretRead, ...]]:
    """``_resolve`` one leaf at a time, so that each problem and each secret read has its key
    (``reads``: what ``env_reads_recorded`` records into); ``oversized`` leaves are left out
    with their problem."""

    resolved = dict_container(cfg, resolve=False)
    problems: list[Problem] = []
    unresolved: list[PathParts] = []
    secret_reads: list[SecretRead] = []
    for parts, node in _leaf_nodes(cfg, ()):
        if aliases.is_alias_path(parts):
            continue  # the section it stands for is resolved (and reported) under its own name
        if parts in oversized:
            too_large = oversized[parts]  # None: it grows through a key reported itself
            problems += [too_large] if too_large is not None else []
            unresolved.append(parts)
            _remove(resolved, parts)
            continue
        reads.clear()
        value, problem = _resolve_leaf(cfg, parts, node)
        secret = next((name for name in reads if is_secret_name(name)), None)
        if secret is not None:  # its value (or its error, which may quote it) stays unseen
            secret_reads.append(SecretRead(parts=parts, name=secret, text=str(node._value())))
        elif problem is None:
            _set(resolved, parts, value)
            continue
        else:
            problems.append(problem)
        unresolved.append(parts)
        _remove(resolved, parts)
    return resolved, problems, tuple(unresolved), tuple(secret_reads)


def _resolve_leaf(cfg: DictConfig, parts: PathParts, node: Any) -> tuple[Any, Problem | None]:
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    key = format_path(parts)
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
        return value, None
    except MissingMandatoryValue:
        return None, Problem(
            path=key,
            value="???",
            message="must be set (the recipe leaves it as ???)",
            fix=f"set it, e.g. with the override {key}=VALUE",
        )
    except OmegaConfBaseException as exc:
        message = " ".join(str(exc).split("\n")[0].split())
        return None, Problem(
            path=key,
            value=node._value(),
            message=f"cannot resolve: {message}",
            fix=_resolution_fix(message),
        )


def _resolution_fix(message: str) -> str:
    """What to do about an interpolation that failed, by what failed."""
    if "RecursionError" in message:
        return "make ${...} refer to the value itself instead of through a long chain of keys"
    missing_env = re.search(r"Environment variable '([^']+)' not found", message)
    if missing_env:
        name = missing_env.group(1)
        return (
            f"set the variable in this shell (export {name}=...), or give a default: "
            f"${{oc.env:{name},DEFAULT}}"
        )
    if "Unsupported interpolation type" in message:
        return f"the resolvers a recipe may use: {resolver_names()}; ${{a.b}} names another key"
    return "point ${...} at an existing key (full dotted path from the top)"


def _leaf_nodes(node: Any, parts: tuple) -> list[tuple[tuple, Any]]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig) and not node._is_interpolation() and not node._is_none():
        children = [(key, node._get_node(key)) for key in node.keys()]
    elif OmegaConf.is_list(node) and not node._is_interpolation() and not node._is_none():
        children = [(index, node._get_node(index)) for index in range(len(node))]
    else:
        return [(parts, node)]
    return [leaf for key, child in children for leaf in _leaf_nodes(child, parts + (key,))]


def _set(data: Any, parts: PathParts, value: Any) -> None:
    for part in parts[:-1]:
        data = data[part]
    data[parts[-1]] = value


def _remove(data: Any, parts: PathParts) -> None:
    for part in parts[:-1]:
        data = data[part]
    if isinstance(data, dict):
        del data[parts[-1]]
    else:
        data[parts[-1]] = None  # a list keeps its length; the key is reported already
