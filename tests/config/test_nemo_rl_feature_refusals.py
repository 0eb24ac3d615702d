"""NeMo RL features hpcrl does not have, refused by what they are (each message names the
feature and what NeMo RL does with it), and their "off" values accepted, on NeMo RL's own
files (tests/nemo_rl_snapshots.py): a refusal that said only "not implemented by hpcrl"
named a key, not a feature, and refused ``real_quant: false``,
``expose_http_server: false`` and ``moe_router_group_topk: null``, which NeMo RL reads as
off (``bool(cfg.get(...))``, Megatron's default).
"""

from __future__ import annotations

import pytest

from tests.config.test_nemo_rl_refusals import errors_of

QA_BF16 = "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-bf16-300step.yaml"
QA_NVFP4 = "recipes/llm/grpo-qwen3-30ba3b-4n4g-megatron-qa-nvfp4-w4a4-real.yaml"
MCORE_GENERATION = "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron_generation.yaml"


@pytest.mark.parametrize(
    ("relative", "path", "names"),
    [
        (
            "recipes/llm/grpo-qwen3-1.7b-1n4g-megatron-eagle3.yaml",
            "policy.draft",
            ("EAGLE-3 speculative decoding", "draft model"),
        ),
        (
            "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron-cp2-r3.yaml",
            "policy.router_replay",
            ("MoE router replay", "routed"),
        ),
        (
            "recipes/llm/performance/grpo-qwen3-30ba3b-4n4g-mxfp8-rollout.yaml",
            "policy.generation.vllm_cfg.is_mx",
            ("MXFP8 generation", "no FP8 kernels"),
        ),
        (QA_NVFP4, "policy.quant_cfg", ("ModelOpt quantization", "NVFP4")),
        (QA_NVFP4, "policy.generation.quant_cfg", ("ModelOpt quantization",)),
        (
            MCORE_GENERATION,
            "policy.generation.mcore_generation_config.transformer_impl",
            ("Megatron inference engine", "training's layout"),
        ),
    ],
)
def test_a_feature_hpcrl_lacks_is_refused_by_what_it_is(relative, path, names):
    errors = errors_of(relative, [])
    message = next(text for where, text in errors.items() if where.startswith(path))
    assert "not supported yet" in message and "fix:" in message, message
    for name in names:
        assert name in message, (name, message)


def test_freezing_megatron_submodules_is_refused_by_what_it_is():
    # NeMo RL's files set it only for vision-language models (not counted by the bar)
    switch = "++policy.megatron_cfg.freeze_config.freeze_vision_model=true"
    errors = errors_of("grpo_math_1B_megatron.yaml", [switch])
    message = errors["policy.megatron_cfg.freeze_config"]
    assert "freezing parts of a Megatron model" in message and "weight decay" in message


def test_the_off_values_nemo_rl_reads_as_off_are_accepted():
    qa = errors_of(QA_BF16, [])
    assert "policy.generation.real_quant" not in qa  # real_quant: false
    assert "policy.quant_calib_data" not in qa  # read only with quant_cfg, refused above
    generation = errors_of(MCORE_GENERATION, [])
    for key in ("moe_router_group_topk", "moe_router_num_groups"):  # null
        assert f"policy.generation.mcore_generation_config.{key}" not in generation, key
    # expose_http_server: false (its dynamo file sets it beside the dynamo backend)
    dynamo = errors_of("grpo_math_1B_dynamo.yaml", [])
    assert not [path for path in dynamo if path.endswith("expose_http_server")]


def test_each_off_value_is_accepted_and_the_on_value_refused():
    accepted = [
        "++policy.generation.real_quant=false",
        "++policy.generation.vllm_cfg.expose_http_server=false",
        "++policy.draft.enabled=false",
        "++policy.router_replay.enabled=false",
        "++policy.generation.vllm_cfg.is_mx=false",
    ]
    from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

    load_as_hpcrl(config_path("grpo_math_1B.yaml"), accepted)  # no error
    refused = errors_of(
        "grpo_math_1B.yaml",
        [
            "++policy.generation.real_quant=true",
            "++policy.generation.vllm_cfg.expose_http_server=true",
        ],
    )
    assert "ModelOpt quantization" in refused["policy.generation.real_quant"]
    assert "serving vLLM over HTTP" in refused["policy.generation.vllm_cfg.expose_http_server"]
