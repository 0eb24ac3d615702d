"""``grpo.val_at_end`` / ``sft.val_at_end`` (NeMo RL's meaning: validate after the last step
as well, whatever val_period says), with the values of NeMo RL's own recipes:
grpo-cispo-mm1-async-lag1-highoffpolicy-qwen3-30ba3b-3n8g-megatron-cispo.yaml (v0.7.0 and
main 7ea279a) sets ``max_num_steps: 10, val_at_start: true, val_at_end: true`` over
grpo_math_1B.yaml's ``val_period: 10``; grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-
bf16-300step.yaml the same with 300 steps. The driver's step loop (``run_steps``) over
scripted steps records when it validated and which checkpoints kept a validation metric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.require import require_module

require_module("torch")
require_module("transformers")

from hpcrl.config import load_recipe  # noqa: E402
from hpcrl.core.data.jsonl import EpochSampler  # noqa: E402
from hpcrl.core.driver import run_steps  # noqa: E402
from tests.core._driver_harness import REPO_ROOT  # noqa: E402
from tests.core.recording_policy import RecordingPolicy, rows, tokenizer  # noqa: E402


def _validated_steps(tmp_path: Path, num_steps: int, overrides: list[str]) -> list[int]:
    recipe = load_recipe(REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml", overrides).recipe
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done: list[int] = []
    validated: list[int] = []

    def step_fn(step: int) -> dict:
        done.append(step)
        return {
            "step": step, "loss": 1.0, "grad_norm": 1.0, "reward_mean": 0.5,
            "reward_std": 0.0, "tokens_per_s": 1.0,
        }  # fmt: skip

    def validate() -> dict[str, float]:
        validated.append(done[-1] if done else 0)
        return {"val_reward_mean": 0.25}

    tok = tokenizer(recipe)
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    policy = RecordingPolicy(tok.eos_token_id, 0)
    assert run_steps(policy, recipe, step_fn, sampler, run_dir, num_steps, validate) == 0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line)["step"] for line in lines if "val_reward_mean" in line]
    assert logged == validated  # every validation is in the step's metrics line
    return validated


@pytest.mark.parametrize(
    ("num_steps", "val_period", "want"),
    [
        (10, 10, [0, 10]),  # the cispo recipe: the last step validates once, not twice
        (7, 10, [0, 7]),  # the same recipe cut short (max_num_epochs): the end still validates
        (12, 5, [0, 5, 10, 12]),
    ],
)
def test_val_at_end_validates_after_the_last_step(tmp_path, num_steps, val_period, want) -> None:
    nemo_rl = ["grpo.val_at_start=true", "grpo.val_at_end=true"]
    got = _validated_steps(
        tmp_path,
        num_steps,
        [*nemo_rl, f"grpo.max_num_steps={num_steps}", f"grpo.val_period={val_period}"],
    )
    assert got == want


def test_without_val_at_end_the_last_step_validates_only_on_the_period(tmp_path) -> None:
    got = _validated_steps(
        tmp_path, 7, ["grpo.val_at_start=true", "grpo.max_num_steps=7", "grpo.val_period=10"]
    )
    assert got == [0]


def test_nemo_rl_val_at_end_true_loads_for_grpo_and_sft() -> None:
    grpo = load_recipe(REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml", ["grpo.val_at_end=true"])
    assert grpo.recipe.grpo.val_at_end is True
    sft = load_recipe(REPO_ROOT / "recipes" / "sft-tiny-1n-cpu.yaml", ["sft.val_at_end=true"])
    assert sft.recipe.sft.val_at_end is True
