"""Rules of a recipe's environment variables (``policy.megatron_cfg.env_vars`` and the same
mapping under ``value`` and ``teacher``): their values are exported in job.sbatch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe
from hpcrl.config.secrets import PASS_ENV_FIX, find_secrets, is_secret_name

POLICY_ENV_VARS = "policy.megatron_cfg.env_vars"


def _env_var_sections(recipe: Recipe) -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield POLICY_ENV_VARS, recipe.policy.megatron_cfg.env_vars
    if recipe.value is not None:
        yield "value.megatron_cfg.env_vars", recipe.value.megatron_cfg.env_vars
    if recipe.teacher is not None:
        section = recipe.teacher.megatron_cfg_overrides.get("env_vars")
        if isinstance(section, Mapping):
            yield "teacher.megatron_cfg_overrides.env_vars", section


def rule_no_secrets_in_env_vars(recipe: Recipe) -> list[Problem]:
    """No secret-shaped name with a value, no token as a value: both would land in job.sbatch."""
    problems = []
    for section, env_vars in _env_var_sections(recipe):
        for name, value in env_vars.items():
            kinds = find_secrets(str(value), environ={})
            if not is_secret_name(name) and not kinds:
                continue
            what = "a secret-shaped name" if is_secret_name(name) else ", ".join(kinds)
            problems.append(
                Problem(
                    path=f"{section}.{name}",
                    value="<hidden>",
                    message=f"holds a secret ({what}); environment variables are written into "
                    "job.sbatch",
                    fix=PASS_ENV_FIX.format(name=name if is_secret_name(name) else "it"),
                )
            )
    return problems


def rule_megatron_env_vars_need_megatron(recipe: Recipe) -> list[Problem]:
    """The job exports ``policy.megatron_cfg.env_vars`` only for the Megatron backend."""
    if recipe.backend == "megatron":
        return []
    return [
        Problem(
            path=f"{POLICY_ENV_VARS}.{name}",
            value=value if not is_secret_name(name) else "<hidden>",
            message="set on a recipe that trains with the Automodel backend, which never "
            "exports policy.megatron_cfg.env_vars",
            fix="move it to the cluster profile's env (every backend), or remove it",
        )
        for name, value in sorted(recipe.policy.megatron_cfg.env_vars.items())
    ]


ENV_RULES = (rule_no_secrets_in_env_vars, rule_megatron_env_vars_need_megatron)
