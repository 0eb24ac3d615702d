"""What scores a run's GRPO rollouts, set up by the driver before the policy's workers start:
the recipe's environment (``hpcrl.core.environments.build``), or the reward-model scorers
(Ray actors on the GPUs the plan carved out for them, ``hpcrl.core.workers.reward_model_actor``).

Kept apart from ``hpcrl.core.driver`` so the driver holds only the run's order of events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcrl.config.recipe import Recipe
from hpcrl.core.phase import report_phase
from hpcrl.run.jobspec import JobSpec


def recipe_environment(recipe: Recipe) -> Any:
    """The run's environment; None for SFT and for the reward model, whose scorers are
    Ray actors of their own (``start_reward_model``)."""
    from hpcrl.config.datasets import data_env_name

    name = data_env_name(recipe)
    if recipe.algorithm != "grpo" or name == "reward_model":
        return None
    from hpcrl.core.environments.build import build_environment

    return build_environment(recipe.env, name)


def start_reward_model(jobspec: JobSpec, run_dir: Path, device: str) -> Any:
    """The reward-model scorers on the GPUs the plan carved out for them (None without).

    ``device`` is the job's (``hpcrl.core.driver.job_device``): passed in rather than
    derived here so the plan's device has one reader."""
    if jobspec.reward_model is None:
        return None
    from hpcrl.core.workers.reward_model_actor import start_scorers

    report_phase(run_dir, f"starting {jobspec.reward_model.num_scorers} reward-model scorer(s)")
    return start_scorers(jobspec, device)
