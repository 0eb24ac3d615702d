"""``policy.hf_config_overrides`` under the Megatron backend at validate: NeMo RL's YaRN
recipes and max_position_embeddings pass; any key megatron-bridge cannot carry into the
Megatron model with Hugging Face's meaning is refused by its full path, with the reason."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError
from hpcrl.config.megatron_hf_overrides import megatron_hf_override_problems
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

YARN_RECIPES = (
    "recipes/llm/sft-qwen3-0.6B-1n8g-megatron-yarn-128k.yaml",
    "recipes/llm/grpo-qwen2.5-1.5B-4n8g-megatron-yarn-256k.yaml",
)


def _override_errors(relative: str, overrides: list[str]) -> list[str]:
    try:
        load_as_hpcrl(config_path(relative), overrides)
    except ConfigError as error:
        return [p.path for p in error.errors if p.path.startswith("policy.hf_config_overrides")]
    return []


@pytest.mark.parametrize("relative", YARN_RECIPES)
def test_nemo_rl_yarn_recipes_pass(relative):
    assert _override_errors(relative, []) == []


def test_what_megatron_cannot_carry_is_refused_by_key():
    relative = YARN_RECIPES[0]
    assert _override_errors(
        relative,
        [
            "+policy.hf_config_overrides.num_hidden_layers=2",
            "policy.hf_config_overrides.rope_scaling.mscale=2",  # admitted: a YaRN field
            "+policy.hf_config_overrides.rope_scaling.attention_factor=1.1",
        ],
    ) == [
        "policy.hf_config_overrides.num_hidden_layers",
        "policy.hf_config_overrides.rope_scaling.attention_factor",
    ]
    linear = _override_errors(
        relative, ["policy.hf_config_overrides.rope_scaling.rope_type=linear"]
    )
    assert linear == ["policy.hf_config_overrides.rope_scaling.rope_type"]


def test_the_reasons_name_the_fix():
    (problem,) = megatron_hf_override_problems({"rope_scaling": {"type": "dynamic", "factor": 2}})
    assert "only YaRN" in problem.message and "policy.automodel_cfg.enabled=true" in problem.fix
    (missing,) = megatron_hf_override_problems({"rope_scaling": {"rope_type": "yarn"}})
    assert missing.path == "policy.hf_config_overrides.rope_scaling.factor"
    assert megatron_hf_override_problems({"max_position_embeddings": 1536}) == []
    assert megatron_hf_override_problems({"rope_scaling": None}) == []
