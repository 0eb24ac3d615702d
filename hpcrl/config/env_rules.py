"""Rules of a recipe's environment variables: the training backend's (``policy.megatron_cfg.
env_vars`` or ``policy.automodel_cfg.env_vars``, NeMo RL's ``dtensor_cfg.env_vars``: exported
in job.sbatch), vLLM's (``policy.generation.vllm_cfg.env_vars``: set in each vLLM engine's
environment before it starts, as NeMo RL sets them on its vLLM workers only) and the same
mapping under ``value`` and ``teacher``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe
from hpcrl.config.secrets import PASS_ENV_FIX, find_secrets, is_secret_name

POLICY_ENV_VARS = "policy.megatron_cfg.env_vars"
AUTOMODEL_ENV_VARS = "policy.automodel_cfg.env_vars"
VLLM_ENV_VARS = "policy.generation.vllm_cfg.env_vars"


def training_env_vars(recipe: Recipe) -> tuple[str, Mapping[str, str]]:
    """(path, variables) of the backend the recipe trains with: what job.sbatch exports."""
    if recipe.backend == "megatron":
        return POLICY_ENV_VARS, recipe.policy.megatron_cfg.env_vars
    return AUTOMODEL_ENV_VARS, recipe.policy.automodel_cfg.env_vars


def _env_var_sections(recipe: Recipe) -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield POLICY_ENV_VARS, recipe.policy.megatron_cfg.env_vars
    yield AUTOMODEL_ENV_VARS, recipe.policy.automodel_cfg.env_vars
    yield VLLM_ENV_VARS, recipe.policy.generation.vllm_cfg.env_vars
    if recipe.value is not None:
        yield "value.megatron_cfg.env_vars", recipe.value.megatron_cfg.env_vars
    if recipe.teacher is not None:
        section = recipe.teacher.megatron_cfg_overrides.get("env_vars")
        if isinstance(section, Mapping):
            yield "teacher.megatron_cfg_overrides.env_vars", section


def rule_no_secrets_in_env_vars(recipe: Recipe) -> list[Problem]:
    """No secret-shaped name with a value, no token as a value: both would land in job.sbatch
    or the JobSpec."""
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
                    "job.sbatch and the run folder",
                    fix=PASS_ENV_FIX.format(name=name if is_secret_name(name) else "it"),
                )
            )
    return problems


def _shown(name: str, value: Any) -> Any:
    return "<hidden>" if is_secret_name(name) else value


def rule_env_vars_need_their_backend(recipe: Recipe) -> list[Problem]:
    """Each mapping is exported only where its backend runs: the other training backend's and
    vLLM's without vLLM generation would do nothing."""
    unused = [(AUTOMODEL_ENV_VARS, recipe.policy.automodel_cfg.env_vars, "Megatron", "Automodel")]
    if recipe.backend == "automodel":
        unused = [(POLICY_ENV_VARS, recipe.policy.megatron_cfg.env_vars, "Automodel", "Megatron")]
    problems = [
        Problem(
            path=f"{path}.{name}",
            value=_shown(name, value),
            message=f"set on a recipe that trains with the {used} backend, which never exports "
            f"{path} (only a {owner} job does)",
            fix=f"move it to {training_env_vars(recipe)[0]} or the cluster profile's env, or "
            "remove it",
        )
        for path, env_vars, used, owner in unused
        for name, value in sorted(env_vars.items())
    ]
    if recipe.policy.generation.backend != "vllm":
        problems += [
            Problem(
                path=f"{VLLM_ENV_VARS}.{name}",
                value=_shown(name, value),
                message="set while policy.generation.backend is not vllm: no vLLM engine "
                "starts to read it",
                fix="remove it, or set policy.generation.backend=vllm",
            )
            for name, value in sorted(recipe.policy.generation.vllm_cfg.env_vars.items())
        ]
    return problems


def rule_colocated_env_vars_agree(recipe: Recipe) -> list[Problem]:
    """A colocated vLLM engine starts inside the training worker's process: one variable
    cannot hold the training backend's value and vLLM's at once there (NeMo RL runs its
    vLLM workers as processes of their own)."""
    generation = recipe.policy.generation
    if generation.backend != "vllm" or not generation.colocated.enabled:
        return []
    path, training = training_env_vars(recipe)
    return [
        Problem(
            path=f"{VLLM_ENV_VARS}.{name}",
            value=_shown(name, value),
            message=f"differs from {path}.{name} ({_shown(name, training[name])!r}); colocated "
            "vLLM runs in the training worker's process, which can hold only one of them",
            fix="give both the same value, or remove one of them (or set "
            "policy.generation.colocated.enabled=false: vLLM then runs in processes of its own)",
        )
        for name, value in sorted(generation.vllm_cfg.env_vars.items())
        if name in training and str(training[name]) != str(value)
    ]


ENV_RULES = (
    rule_no_secrets_in_env_vars,
    rule_env_vars_need_their_backend,
    rule_colocated_env_vars_agree,
)
