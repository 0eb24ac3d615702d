"""LoRA settings hpcrl cannot honour, or that say nothing, are refused at load time with the
path, the value, the reason and the fix; NeMo RL's LoRA recipes on the Megatron backend are
refused by name, pointing at the Automodel backend's LoRA."""

from __future__ import annotations

from hpcrl.config import ConfigError
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

LORA = "policy.dtensor_cfg.lora_cfg"
QWEN_LORA = "recipes/llm/grpo-qwen3-8B-base-1n8g-fsdp2-lora.yaml"


def errors_of(relative: str, overrides: list[str]) -> dict[str, str]:
    try:
        load_as_hpcrl(config_path(relative), overrides)
    except ConfigError as error:
        return {problem.path: problem.format() for problem in error.errors}
    raise AssertionError("loaded without errors")


def test_lora_with_tensor_parallelism_is_refused_with_the_fix():
    errors = errors_of(QWEN_LORA, ["policy.dtensor_cfg.tensor_parallel_size=2"])
    text = errors[f"{LORA}.enabled"]
    assert "tensor parallelism is not supported" in text
    assert "tensor_parallel_size=1" in text


def test_targets_beside_match_all_linear_or_excludes_are_refused():
    errors = errors_of(QWEN_LORA, [f"{LORA}.target_modules=[q_proj]"])
    assert f"set {LORA}.match_all_linear=false" in (errors[f"{LORA}.match_all_linear"])
    both = [
        f"{LORA}.match_all_linear=false",
        f"{LORA}.target_modules=[q_proj]",
        f"{LORA}.exclude_modules=[lm_head]",
    ]
    assert "exclude each other" in errors_of(QWEN_LORA, both)[f"{LORA}.exclude_modules"]
    nothing = errors_of(QWEN_LORA, [f"{LORA}.match_all_linear=false"])
    assert "no layer is chosen" in nothing[f"{LORA}.target_modules"]


def test_rank_and_dropout_out_of_range_are_refused():
    errors = errors_of(QWEN_LORA, [f"{LORA}.dim=0", f"{LORA}.dropout=1.5"])
    assert set(errors) >= {
        f"{LORA}.dim",
        f"{LORA}.dropout",
    }


def test_megatron_lora_is_refused_naming_the_automodel_backend():
    errors = errors_of("recipes/llm/grpo-qwen3-8b-base-1n8g-megatron-lora.yaml", [])
    text = errors["policy.megatron_cfg.peft"]
    assert "Megatron backend is not supported yet" in text
    assert "policy.dtensor_cfg.lora_cfg" in text
    assert "set policy.megatron_cfg.peft.enabled=false" in text
