"""Run folders for driver tests: a shipped recipe (plus overrides) resolved the way
``hpcrl submit`` resolves it, then ``run_training`` on it in this process (Ray from the
caller's fixture). Also reads metrics.jsonl back."""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_run_dir(run_dir: Path, recipe: str, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    import yaml

    from hpcrl.config import load_recipe

    run_dir.mkdir(parents=True, exist_ok=True)
    loaded = load_recipe(REPO_ROOT / "recipes" / recipe, list(overrides))
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(loaded.resolved_dict))
    return run_dir


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)
