"""LoRA settings hpcrl cannot honour, or that say nothing, are refused at load time with the
path, the value, the reason and the fix; NeMo RL's LoRA recipes on the Megatron backend load
(megatron_cfg.peft), with the settings hpcrl does not honour refused by name."""

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


MEGATRON_LORA = "recipes/llm/grpo-qwen3-8b-base-1n8g-megatron-lora.yaml"
PEFT = "policy.megatron_cfg.peft"


def test_nemo_rls_megatron_lora_recipe_loads_with_its_settings():
    """Its own values (dim 128, alpha 128) over grpo_math_1B's defaults (dropout_position
    post, xavier/zero, lora_dtype "None" as NeMo RL's YAML writes it)."""
    recipe = load_as_hpcrl(config_path(MEGATRON_LORA), []).recipe
    peft = recipe.policy.megatron_cfg.peft
    assert (peft.enabled, peft.dim, peft.alpha, peft.dropout_position) == (True, 128, 128, "post")
    assert (peft.lora_A_init_method, peft.lora_B_init_method) == ("xavier", "zero")
    assert (peft.target_modules, peft.exclude_modules) == ((), ())


def test_megatron_lora_settings_hpcrl_does_not_honour_are_refused_by_name():
    errors = errors_of(
        MEGATRON_LORA,
        [
            f"{PEFT}.a2a_experimental=true",
            f"{PEFT}.lora_dtype=bfloat16",
            f"{PEFT}.target_modules=[linear_qkv]",
            f"{PEFT}.exclude_modules=[linear_fc2]",
            f"{PEFT}.dim=0",
        ],
    )
    assert "expert adapters" in errors[f"{PEFT}.a2a_experimental"]
    assert f"fix: set {PEFT}.a2a_experimental=false" in errors[f"{PEFT}.a2a_experimental"]
    assert f"fix: set {PEFT}.lora_dtype=null" in errors[f"{PEFT}.lora_dtype"]
    assert "not both" in errors[f"{PEFT}.exclude_modules"]
    assert "rank must be at least 1" in errors[f"{PEFT}.dim"]
