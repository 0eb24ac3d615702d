"""``checkpointing.checkpoint_must_save_by`` as NeMo RL's TimeoutChecker (fit_last_save_time)
treats it, with its recipes' value '00:03:45:00': after each step, once the time spent plus
the average step reaches the deadline, save and stop, once. hpcrl then exits unfinished (the
preempted exit code; ``hpcrl resume`` continues from that checkpoint); without checkpointing
it stops as NeMo RL does."""

from __future__ import annotations

import pytest

from tests.require import require_module

require_module("torch")
require_module("transformers")

from hpcrl.config import ConfigError, load_recipe  # noqa: E402
from hpcrl.core.data.jsonl import EpochSampler  # noqa: E402
from hpcrl.core.driver import run_steps  # noqa: E402
from hpcrl.core.phase import ATTEMPT_ID_VARIABLE  # noqa: E402
from hpcrl.core.save_deadline import SaveDeadline  # noqa: E402
from hpcrl.run.checkpoints import complete_checkpoints  # noqa: E402
from hpcrl.run.markers import PREEMPTED_EXIT_CODE, SAVE_DEADLINE, read_marker  # noqa: E402
from tests.core._driver_harness import REPO_ROOT  # noqa: E402
from tests.core.recording_policy import RecordingPolicy, rows, tokenizer  # noqa: E402
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl  # noqa: E402

KEY = "checkpointing.checkpoint_must_save_by"


def test_the_deadline_counts_the_next_average_step_and_fires_once():
    now = [0.0]
    deadline = SaveDeadline.from_text("00:00:01:40", clock=lambda: now[0])  # 100 s
    assert deadline is not None and deadline.deadline_s == 100
    fired = []
    for step_s in (30, 30, 30, 30):  # after step 2: 60 s + 30 s average < 100; step 3: 120
        now[0] += step_s
        fired.append(deadline.step_done())
    assert fired == [False, False, True, False]
    assert SaveDeadline.from_text(None) is None


def test_nemo_rl_recipes_value_loads_and_a_malformed_one_is_refused():
    loaded = load_as_hpcrl(config_path("grpo_math_1B.yaml"), [f"{KEY}=00:03:45:00"])
    assert loaded.recipe.checkpointing.checkpoint_must_save_by == "00:03:45:00"
    with pytest.raises(ConfigError) as caught:
        load_as_hpcrl(config_path("grpo_math_1B.yaml"), [f"{KEY}=3h"])
    (problem,) = caught.value.errors
    assert problem.format() == (
        f"error: {KEY} = '3h': not a duration written DD:HH:MM:SS (days, hours, minutes, "
        f"seconds)\n  fix: write it as NeMo RL does, e.g. {KEY}: '00:03:45:00' (3 h 45 min), "
        "or null"
    )


def _run(tmp_path, overrides: list[str]) -> tuple[int, list[int]]:
    recipe = load_recipe(REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml", overrides).recipe
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    done: list[int] = []

    def step_fn(step: int) -> dict:
        done.append(step)
        return {"step": step, "loss": 1.0, "grad_norm": 1.0, "reward_mean": 0.5,
                "reward_std": 0.0, "tokens_per_s": 1.0}  # fmt: skip

    policy = RecordingPolicy(tokenizer(recipe).eos_token_id, 0)
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    return run_steps(policy, recipe, step_fn, sampler, run_dir, 6, None), done


def test_a_reached_deadline_saves_and_exits_unfinished(tmp_path, monkeypatch):
    monkeypatch.setenv(ATTEMPT_ID_VARIABLE, "77.0")  # as the job's driver process sets it
    code, done = _run(
        tmp_path,
        [f"{KEY}=00:00:00:00", "checkpointing.enabled=true", "checkpointing.save_period=5"],
    )
    assert (code, done) == (PREEMPTED_EXIT_CODE, [1])
    (saved,) = complete_checkpoints(tmp_path / "run" / "checkpoints")
    assert saved[0] == 1
    # what the node entrypoint names as the attempt's end (tests/job/test_diagnosis.py)
    stop = read_marker(tmp_path / "run", SAVE_DEADLINE, "77.0")
    assert stop is not None and (stop["step"], stop["checkpoint"]) == (1, str(saved[1]))


def test_without_checkpointing_it_stops_as_nemo_rl_does(tmp_path):
    code, done = _run(tmp_path, [f"{KEY}=00:00:00:00", "checkpointing.enabled=false"])
    assert (code, done) == (0, [1])
    code, done = _run(tmp_path / "far", [f"{KEY}=01:00:00:00"])
    assert (code, done) == (0, [1, 2, 3, 4, 5, 6])
