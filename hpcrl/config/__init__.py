"""Recipe and cluster-profile schemas, loading, and validation rules (data path step 1).

Public API::

    load_recipe(path_or_name, overrides=()) -> LoadedRecipe   # raises ConfigError
    load_profile(name_or_path) -> ClusterProfile               # raises ConfigError
    validate_recipe_dict(plain_dict) -> (Recipe, warnings)     # e.g. recipe.resolved.yaml
    list_recipes(), list_profiles()                             # name -> file
    ConfigError(problems), Problem, print_problems(problems)
"""

from typing import TYPE_CHECKING, Any

from hpcrl.config.converter import structure_profile, structure_recipe, unstructure
from hpcrl.config.errors import (
    ConfigError,
    Problem,
    format_problems,
    print_problems,
    render_problems,
)
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe

if TYPE_CHECKING:
    from hpcrl.config.load_and_check import (
        LoadedRecipe,
        load_profile,
        load_profile_with_warnings,
        load_recipe,
        validate_recipe_dict,
    )
    from hpcrl.config.locate import list_profiles, list_recipes, profile_search_path

#: The loaders, imported when first used: the job side imports this package for its schema
#: types (``hpcrl.config.recipe`` runs this file first) and never loads a config file, so
#: YAML, OmegaConf and the overrides never load there (tests/test_stage_boundaries.py).
_LOADERS = {
    "LoadedRecipe": "hpcrl.config.load_and_check",
    "load_profile": "hpcrl.config.load_and_check",
    "load_profile_with_warnings": "hpcrl.config.load_and_check",
    "load_recipe": "hpcrl.config.load_and_check",
    "validate_recipe_dict": "hpcrl.config.load_and_check",
    "list_profiles": "hpcrl.config.locate",
    "list_recipes": "hpcrl.config.locate",
    "profile_search_path": "hpcrl.config.locate",
}


def __getattr__(name: str) -> Any:
    if name not in _LOADERS:
        raise AttributeError(f"module 'hpcrl.config' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LOADERS[name]), name)


__all__ = [
    "ClusterProfile",
    "ConfigError",
    "LoadedRecipe",
    "Problem",
    "Recipe",
    "format_problems",
    "list_profiles",
    "list_recipes",
    "load_profile",
    "load_profile_with_warnings",
    "load_recipe",
    "print_problems",
    "profile_search_path",
    "render_problems",
    "structure_profile",
    "structure_recipe",
    "unstructure",
    "validate_recipe_dict",
]
