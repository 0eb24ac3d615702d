"""Validation samples as NeMo RL samples it: never greedily (its ``validate`` passes
``greedy=False`` in v0.5.0, v0.7.0 and main 7ea279a), at ``policy.generation.val_temperature``
and ``val_top_p`` (main's grpo_math_1B.yaml: ``${.temperature}``, ``${.top_p}``; NeMo RL's
NeMo-Gym path honours other values), which default to the training ones."""

from __future__ import annotations

import pytest

from tests.require import require_module

require_module("torch")
require_module("transformers")

from hpcrl.config import load_recipe  # noqa: E402
from hpcrl.core.algorithms.validation import grpo_validation, validation_sampling  # noqa: E402
from tests.core._driver_harness import REPO_ROOT  # noqa: E402
from tests.core.recording_policy import RecordingPolicy, ScriptedEnv, rows, tokenizer  # noqa: E402
from tests.nemo_rl_snapshots import (  # noqa: E402
    RELEASES,
    config_path,
    load_as_hpcrl,
    nemo_rl_config,
)


@pytest.mark.parametrize("release", RELEASES)
def test_nemo_rl_grpo_math_1b_validates_at_its_training_sampling(release: str) -> None:
    nemo_rl = nemo_rl_config(release, "grpo_math_1B.yaml")["policy"]["generation"]
    recipe = load_as_hpcrl(config_path("grpo_math_1B.yaml", release)).recipe
    sampling = validation_sampling(recipe.policy.generation)
    want_temperature = nemo_rl.get("val_temperature", nemo_rl["temperature"])
    want_top_p = nemo_rl.get("val_top_p", nemo_rl["top_p"])
    assert (sampling.temperature, sampling.top_p) == (want_temperature, want_top_p)
    assert sampling.temperature == 1.0  # NeMo RL's value: sampled, not greedy (0)


def _validation_calls(overrides: list[str]) -> list:
    recipe = load_recipe(REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml", overrides).recipe
    tok = tokenizer(recipe)
    policy = RecordingPolicy(tok.eos_token_id, tok.convert_tokens_to_ids("a"))
    metrics = grpo_validation(policy, recipe, tok, ScriptedEnv(), rows(8))
    assert metrics["val_num_prompts"] == 8.0
    return [call for call in policy.calls if call[0] == "generate"]


def test_validation_generates_at_val_temperature_and_val_top_p() -> None:
    ((_, cfg, _, lengths),) = _validation_calls(
        ["policy.generation.val_temperature=0.6", "policy.generation.val_top_p=0.9"]
    )
    assert (cfg["temperature"], cfg["top_p"]) == (0.6, 0.9)
    assert len(lengths) == 8


def test_validation_defaults_to_the_training_sampling_not_greedy() -> None:
    ((_, cfg, _, _),) = _validation_calls(["policy.generation.temperature=0.8"])
    assert (cfg["temperature"], cfg["top_p"]) == (0.8, 1.0)


def test_negative_val_temperature_and_val_top_p_out_of_range_are_refused() -> None:
    from hpcrl.config.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_recipe(
            REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml",
            ["policy.generation.val_temperature=-1", "policy.generation.val_top_p=0"],
        )
    text = str(caught.value)
    assert "policy.generation.val_temperature" in text and "policy.generation.val_top_p" in text
