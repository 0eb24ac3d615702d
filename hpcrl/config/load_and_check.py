"""The public loaders: a recipe or profile name/path (+ overrides) → validated attrs object.

Every problem found on the way (YAML, defaults, overrides, interpolation, structure, rules)
is raised together in one ``ConfigError``; warnings come back with the result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config import aliases
from hpcrl.config.converter import format_path, unstructure
from hpcrl.config.errors import ConfigError, Problem, raise_if_errors
from hpcrl.config.foreign_keys import find_foreign_key
from hpcrl.config.locate import (
    find_profile,
    find_recipe,
    profile_search_path,
    shipped_recipes_dir,
)
from hpcrl.config.merged_yaml import (
    BaseSearch,
    MergedConfig,
    SecretRead,
    load_merged,
    name_interpolation_sources,
    structure_leniently,
)
from hpcrl.config.nemo_rl_filter import UnusedKey, nemo_rl_parts, take_out_nemo_rl_keys
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.profile_rules import check_profile
from hpcrl.config.recipe import Recipe
from hpcrl.config.rules import check_recipe
from hpcrl.config.secrets import PASS_ENV_FIX
from hpcrl.config.shared_methods import SharedMethods

#: Free-form mappings of environment variables (``policy.megatron_cfg.env_vars``): their
#: values are exported in job.sbatch.
ENV_VARS_KEY = "env_vars"


@attrs.frozen(kw_only=True)
class LoadedRecipe(SharedMethods):
    """A validated recipe and where it came from.

    resolved_dict: the plain dict after `defaults:` merging, overrides and interpolation
    (data paths absolute): what ``recipe.resolved.yaml`` holds (no value of it ever came from
    a secret-named variable: ``load_recipe`` refuses those). warnings: problems of severity
    "warning" (the recipe is usable).
    """

    recipe: Recipe
    source_path: Path
    resolved_dict: dict[str, Any]
    overrides: tuple[str, ...] = ()
    warnings: list[Problem] = attrs.field(factory=list)
    unused_nemo_rl_keys: tuple[UnusedKey, ...] = ()

    def effective_dict(self) -> dict[str, Any]:
        """Every field with the value it takes, code defaults included (resolved_dict holds
        only what the files and overrides wrote). Structures back to the same Recipe."""
        return unstructure(self.recipe)


def load_recipe(path_or_name: str | os.PathLike, overrides: Sequence[str] = ()) -> LoadedRecipe:
    """Load, merge, override, resolve, structure and check a recipe; raise ConfigError."""
    source_path = find_recipe(path_or_name)
    search = BaseSearch(folders=(shipped_recipes_dir(),), what="recipe")
    merged = load_merged(source_path, overrides, Recipe, known=_is_foreign_key, search=search)
    problems, resolved = list(merged.problems), merged.resolved
    if resolved is None:
        raise ConfigError(problems)
    unused: list[UnusedKey] = []
    recipe, structure_problems = _structure_and_check(merged, Recipe, check_recipe, unused)
    problems = aliases.respell(problems + structure_problems, merged.spelled_as)
    problems += [_secret_in_recipe(read) for read in merged.secret_reads]
    raise_if_errors(problems)
    assert recipe is not None  # no errors means structuring succeeded
    return LoadedRecipe(
        recipe=recipe,
        source_path=source_path,
        resolved_dict=resolved,
        overrides=tuple(overrides),
        warnings=[problem for problem in problems if not problem.is_error],
        unused_nemo_rl_keys=tuple(
            attrs.evolve(key, path=aliases.respell_path(key.path, merged.spelled_as))
            for key in unused
        ),
    )


def _secret_in_recipe(read: SecretRead) -> Problem:
    """A recipe value may not come from a secret-named variable: recipe values are written
    into the run folder and printed (paths, run names), and nothing in a recipe needs a
    secret: the job's libraries read theirs from its environment (W&B its WANDB_API_KEY,
    Hugging Face its HF_TOKEN), which gets them through the profile's pass_env."""
    name = read.name
    if ENV_VARS_KEY in read.parts:
        where, use = "environment variables are written into job.sbatch", f"read it as ${name}"
    else:
        where = "recipe values are written into the run folder and shown by hpcrl and the job"
        use = "W&B and Hugging Face read their keys from there themselves"
    return Problem(
        path=format_path(read.parts),
        value=read.text,
        message=f"reads {name}, a secret-named variable: {where}",
        fix=f"do not read {name} in a recipe; list it under the cluster profile's pass_env: "
        f"the job then has it in its environment, never on disk ({use})",
    )


def validate_recipe_dict(data: Mapping[str, Any]) -> tuple[Recipe, list[Problem]]:
    """A Recipe from an already merged plain dict (e.g. a run's recipe.resolved.yaml), with
    every structure and rule problem raised together; returns the recipe and its warnings."""
    merged = MergedConfig(resolved=dict(data), raw=dict(data), problems=[])
    recipe, problems = _structure_and_check(merged, Recipe, check_recipe)
    raise_if_errors(problems)
    assert recipe is not None
    return recipe, problems


def load_profile(
    name_or_path: str | os.PathLike,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> ClusterProfile:
    """Find a cluster profile on the search path (or by path), structure and check it.

    ``name`` defaults to the file name without ``.yaml`` (a base's ``name`` is not inherited);
    ``defaults:`` names are found beside the file, then on the profile search path (so a site
    profile may extend a shipped one by name). Warnings are dropped here; use
    ``load_profile_with_warnings`` to show them.
    """
    return load_profile_with_warnings(name_or_path, overrides, environ)[0]


def load_profile_with_warnings(
    name_or_path: str | os.PathLike,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> tuple[ClusterProfile, list[Problem]]:
    path = find_profile(name_or_path, environ)
    # A profile's name is its own (its file's name unless it sets one), never its base's.
    search = BaseSearch(
        folders=tuple(profile_search_path(environ)), own_keys=("name",), what="profile"
    )
    merged = load_merged(path, overrides, ClusterProfile, search=search)
    problems = list(merged.problems)
    if merged.resolved is None:
        raise ConfigError(problems)
    merged.resolved.setdefault("name", path.stem)
    profile, structure_problems = _structure_and_check(merged, ClusterProfile, check_profile)
    problems += structure_problems
    # Every profile value reaches job.sbatch (or the manifest): none may read a secret.
    problems += [_secret_in_profile(read) for read in merged.secret_reads]
    raise_if_errors(problems)
    assert profile is not None
    return profile, [problem for problem in problems if not problem.is_error]


def _is_foreign_key(parts: tuple[str, ...]) -> bool:
    """A key outside the schema that the loader still knows: one of ``foreign_keys`` or one
    the NeMo RL key registry knows (the registry is read only when the first is not)."""
    if find_foreign_key(parts) is not None:
        return True
    from hpcrl.config.nemo_rl_keys import registry

    return registry().lookup(nemo_rl_parts(parts)) is not None


def _secret_in_profile(read: SecretRead) -> Problem:
    name = read.name
    return Problem(
        path=format_path(read.parts),
        value=read.text,
        message=f"reads {name}, a secret-named variable: profile values are written into "
        "job.sbatch and the manifest",
        fix=PASS_ENV_FIX.format(name=name)
        + f'; a setup_lines entry may read it at run time (export OTHER="${name}")',
    )


def _structure_and_check(
    merged: MergedConfig, cls: type, check: Any, unused: list[UnusedKey] | None = None
) -> tuple[Any, list[Problem]]:
    """Structure and check in one round: schema, foreign-key and rule problems together, and
    nothing said twice about a key whose interpolation already failed. For a recipe, NeMo RL
    keys outside the schema are taken out first (``nemo_rl_filter``); ``unused`` gets those
    accepted."""
    assert merged.resolved is not None
    resolved, foreign_problems = merged.resolved, []
    if cls is Recipe:
        judged = take_out_nemo_rl_keys(merged.resolved, merged.raw, Recipe)
        resolved, foreign_problems = judged.kept, judged.problems
        if unused is not None:
            unused += judged.unused
    obj, issues = structure_leniently(resolved, cls)
    issues = [
        issue for issue in issues if not any(_starts(issue.parts, p) for p in merged.unresolved)
    ]
    issues = name_interpolation_sources(issues, merged.raw)
    structure_problems = foreign_problems + [issue.problem for issue in issues]
    rule_problems = check(obj) if obj is not None else []
    left_out = [Problem(path=_dotted(parts), message="") for parts in merged.unresolved]
    if issues or merged.unresolved:
        # Rules saw placeholders or defaults there: keep only what they say elsewhere.
        covered = [*structure_problems, *left_out]
        rule_problems = [p for p in rule_problems if not _overlaps(p.path, covered)]
        return None, structure_problems + rule_problems
    if foreign_problems:
        return None, structure_problems + rule_problems
    return obj, rule_problems


def _starts(parts: tuple, prefix: tuple) -> bool:
    return parts[: len(prefix)] == prefix


def _dotted(parts: tuple) -> str:
    return format_path(parts)


def _overlaps(path: str, problems: list[Problem]) -> bool:
    return any(_is_within(path, other.path) or _is_within(other.path, path) for other in problems)


def _is_within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "[")
