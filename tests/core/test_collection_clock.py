"""The garbage collector's time per step (``hpcrl.core.collection_clock``): the clock counts
the collections that ran and nothing else, and the driver's step loop keeps what existed
before step 1 out of the collector's walks, puts each step's own collections in its metrics
line, and gives everything back to the collector when it ends."""

from __future__ import annotations

import gc
import json
from pathlib import Path

from tests.require import require_module

require_module("torch")
require_module("transformers")

from hpcrl.config import load_recipe  # noqa: E402
from hpcrl.core.collection_clock import CollectionClock, frozen_during_steps  # noqa: E402
from hpcrl.core.data.jsonl import EpochSampler  # noqa: E402
from hpcrl.core.driver import run_steps  # noqa: E402
from tests.core._driver_harness import REPO_ROOT  # noqa: E402
from tests.core.recording_policy import RecordingPolicy, rows, tokenizer  # noqa: E402


def tracked(thing: object) -> bool:
    """Whether the collector's generations hold ``thing`` (frozen objects are in none)."""
    return any(other is thing for other in gc.get_objects())


def test_the_clock_counts_the_collections_between_takes_and_none_after_removal() -> None:
    with CollectionClock().installed() as clock:
        gc.collect()
        gc.collect(0)
        first = clock.take("driver")
        second = clock.take("driver")
    gc.collect()
    assert first["gc_full_collections_driver"] == 1.0
    assert first["time_gc_driver_s"] > 0
    assert second == {"time_gc_driver_s": 0.0, "gc_full_collections_driver": 0.0}
    assert clock.take("driver")["gc_full_collections_driver"] == 0.0  # removed: not counted


def test_objects_from_before_the_steps_are_frozen_only_during_them() -> None:
    kept_from_setup = [[index] for index in range(100)]
    assert tracked(kept_from_setup)
    with frozen_during_steps():
        made_in_a_step = [[index] for index in range(100)]
        assert not tracked(kept_from_setup)
        assert tracked(made_in_a_step)
    assert tracked(kept_from_setup)
    assert gc.get_freeze_count() == 0


def test_each_steps_metrics_line_has_the_drivers_collections_of_that_step(tmp_path) -> None:
    recipe = load_recipe(REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml").recipe
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    built_in_setup = [[index] for index in range(100)]
    frozen_in_step: list[bool] = []

    def step_fn(step: int) -> dict:
        frozen_in_step.append(not tracked(built_in_setup))
        for _ in range(step - 1):  # step 1: none of its own; step 3: two
            gc.collect()
        return {
            "step": step, "loss": 1.0, "grad_norm": 1.0, "reward_mean": 0.5,
            "reward_std": 0.0, "tokens_per_s": 1.0,
        }  # fmt: skip

    policy = RecordingPolicy(tokenizer(recipe).eos_token_id, 0)
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    assert run_steps(policy, recipe, step_fn, sampler, run_dir, 3, None) == 0
    lines = Path(run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["gc_full_collections_driver"] for r in records] == [0.0, 1.0, 2.0]
    assert records[2]["time_gc_driver_s"] > 0
    assert frozen_in_step == [True, True, True]
    assert tracked(built_in_setup) and gc.get_freeze_count() == 0
