"""Async GRPO with ``grpo.async_grpo.in_flight_weight_updates`` around a recording policy
(tests/core/recording_policy.py): the engines are refit right after each training step (not
at the next submission, behind the batches in flight), with the recipe's
``recompute_kv_cache_after_weight_updates``; ages still count from submission, within the
bound. The real engines: tests/vllm/test_in_flight_refit.py, tests/vllm/test_async_grpo.py."""

from __future__ import annotations

import pytest

from tests.require import require_module

require_module("torch")
require_module("transformers")

from hpcrl.config import load_recipe  # noqa: E402
from hpcrl.core.algorithms.async_grpo import AsyncGrpoStep  # noqa: E402
from hpcrl.core.data.jsonl import EpochSampler  # noqa: E402
from tests.core._driver_harness import REPO_ROOT  # noqa: E402
from tests.core.recording_policy import (  # noqa: E402
    RecordingAsyncPolicy,
    ScriptedEnv,
    rows,
    tokenizer,
)

SEPARATE = [
    "policy.generation.backend=vllm",
    "policy.generation.colocated.enabled=false",
    "policy.generation.colocated.resources.num_nodes=1",
    "policy.generation.colocated.resources.gpus_per_node=1",
    "cluster.gpus_per_node=3",
    "grpo.async_grpo.enabled=true",
    "loss_fn.use_importance_sampling_correction=true",
]


def _run(max_age: int, in_flight: bool, recompute: bool, num_steps: int = 4):
    recipe = load_recipe(
        REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml",
        [
            *SEPARATE,
            f"grpo.async_grpo.max_trajectory_age_steps={max_age}",
            f"grpo.async_grpo.in_flight_weight_updates={str(in_flight).lower()}",
            f"grpo.async_grpo.recompute_kv_cache_after_weight_updates={str(recompute).lower()}",
        ],
    ).recipe
    tok = tokenizer(recipe)
    policy = RecordingAsyncPolicy(tok.eos_token_id, tok.convert_tokens_to_ids("a"))
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    step_fn = AsyncGrpoStep(policy, recipe, tok, ScriptedEnv(), sampler, last_step=num_steps)
    records = [step_fn(step) for step in range(1, num_steps + 1)]
    kinds = [call[0] if call[0] != "refit_in_flight" else call for call in policy.calls]
    return records, [k for k in kinds if k in ("submit", "train") or isinstance(k, tuple)]


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("max_age", [1, 2])
def test_in_flight_refit_follows_every_training_step_but_the_last(max_age, recompute) -> None:
    records, calls = _run(max_age, in_flight=True, recompute=recompute)
    refit = ("refit_in_flight", recompute)
    ahead = ["submit"] * (max_age + 1)  # step 1 submits its own batch and max_age more
    if max_age == 1:
        want = [*ahead, "train", refit, "submit", "train", refit, "submit", "train", refit, "train"]
    else:
        want = [*ahead, "train", refit, "submit", "train", refit, "train", refit, "train"]
    assert calls == want
    assert [r["trajectory_age_steps"] for r in records] == [
        min(step - 1, max_age) for step in range(1, 5)
    ]
    assert all("time_refit_s" in r for r in records[:-1]) and "time_refit_s" not in records[-1]


def test_without_in_flight_updates_nothing_refits_after_training() -> None:
    records, calls = _run(1, in_flight=False, recompute=True)
    assert calls == ["submit", "submit", "train", "submit", "train", "submit", "train", "train"]
    assert [r["trajectory_age_steps"] for r in records] == [0, 1, 1, 1]
    assert not any("time_refit_s" in r for r in records)
