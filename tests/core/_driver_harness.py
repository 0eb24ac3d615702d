"""Run folders for driver tests: a shipped recipe (plus overrides) resolved the way
``hpcrl submit`` resolves it, and its plan (jobspec.json) made by the real planner on the
shipped ``local`` profile, as ``hpcrl render --cluster local`` writes them; then
``run_training`` on it in this process (Ray from the caller's fixture). The driver never
plans (the job side does not import the planner): ``write_local_plan`` writes a plan on a
changed local profile (e.g. more worker slots) instead. Also reads metrics.jsonl back."""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_run_dir(
    run_dir: Path,
    recipe: str,
    overrides: list[str] | tuple[str, ...] = (),
    profile_overrides: tuple[str, ...] = (),
) -> Path:
    """The resolved recipe and its plan on the ``local`` profile changed by
    ``profile_overrides`` (planned at once: a recipe the shipped profile cannot hold, e.g.
    3 worker slots, needs them here)."""
    import yaml

    from tests.recipe_builder import shipped_recipe

    run_dir.mkdir(parents=True, exist_ok=True)
    loaded = shipped_recipe(recipe, overrides)
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(loaded.resolved_dict))
    write_local_plan(run_dir, *profile_overrides)
    return run_dir


def local_plan(recipe, run_dir: Path, *profile_overrides: str):
    """``recipe`` planned by the real planner on the shipped ``local`` profile with
    ``profile_overrides`` (``key=value``, e.g. ``worker_slots_per_node=3``)."""
    from hpcrl.config import load_profile
    from hpcrl.plan.planner import plan

    profile = load_profile("local", list(profile_overrides))
    folder = str(run_dir.absolute())
    return plan(recipe, profile, run_dir=folder, recipe_source=folder)


def write_local_plan(run_dir: Path, *profile_overrides: str):
    """Plan the run folder's resolved recipe (``local_plan``) and write its jobspec.json."""
    from hpcrl.config import load_recipe
    from hpcrl.run.jobspec_file import write_jobspec

    recipe = load_recipe(run_dir / "recipe.resolved.yaml").recipe
    spec = local_plan(recipe, run_dir, *profile_overrides)
    write_jobspec(spec)
    return spec


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)
