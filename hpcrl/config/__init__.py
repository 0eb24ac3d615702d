"""Recipe and cluster-profile schemas, loading, and validation rules (data path step 1).

Public API::

    load_recipe(path_or_name, overrides=()) -> LoadedRecipe   # raises ConfigError
    load_profile(name_or_path) -> ClusterProfile               # raises ConfigError
    validate_recipe_dict(plain_dict) -> (Recipe, warnings)     # e.g. recipe.resolved.yaml
    list_recipes(), list_profiles()                             # name -> file
    ConfigError(problems), Problem, print_problems(problems)
"""

from hpcrl.config.converter import structure_profile, structure_recipe, unstructure
from hpcrl.config.errors import (
    ConfigError,
    Problem,
    format_problems,
    print_problems,
    render_problems,
)
from hpcrl.config.load_and_check import (
    LoadedRecipe,
    load_profile,
    load_profile_with_warnings,
    load_recipe,
    validate_recipe_dict,
)
from hpcrl.config.locate import list_profiles, list_recipes, profile_search_path
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe

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
