"""``policy.dtensor_cfg.expert_parallel_size`` (hpcrl's ``policy.automodel_cfg.expert_parallel_size``)
as NeMo RL's own MoE recipes set it: accepted, laid out and rendered; refused by path, value
and fix where the Automodel backend cannot honour it (the sizes at plan time, the model's
experts where its config.json is readable). The training itself: tests/core/test_expert_parallel.py.
"""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config import ConfigError, load_profile
from hpcrl.config.architectures import architecture_problem
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

EP = "policy.automodel_cfg.expert_parallel_size"
SFT_EP4 = "recipes/llm/sft-nanov3-30BA3B-2n4g-fsdp2.yaml"  # 1 node × 4 GPUs (sft.yaml's), ep 4
GRPO_EP16 = "recipes/llm/grpo-qwen3.5-35ba3b-2n8g-automodel-ep16.yaml"  # 2 × 8 GPUs, ep 16
GRPO_EP8 = "recipes/llm/grpo-nemotron3-super-120BA12B-16n8g-automodel-ep8.yaml"  # 16 × 8, ep 8
GLM_EP32 = "recipes/llm/grpo-glm47-flash-4n8g-automodel.yaml"  # GLM-4.7-Flash, 4 × 8, ep 32
GEMMA4_EP32 = "recipes/llm/dapo-gemma4-26ba4b-it-4n8g-fsdp2-automodel.yaml"  # the same, Gemma 4


def planned(relative: str, *overrides: str):
    recipe = load_as_hpcrl(config_path(relative), list(overrides)).recipe
    return recipe, plan(recipe, load_profile("eos"), run_dir="/runs/ep", recipe_source="ep.yaml")


def plan_errors(relative: str, *overrides: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        planned(relative, *overrides)
    return {problem.path: problem.format() for problem in caught.value.errors}


@pytest.mark.parametrize(
    ("relative", "overrides", "ep", "dp_shard"),
    [
        (SFT_EP4, (), 4, 4),
        (SFT_EP4, ("cluster.num_nodes=2",), 4, 8),  # two EP groups of 4
        (GRPO_EP16, (), 16, 16),
        (GRPO_EP8, (), 8, 128),  # 16 EP groups of 8
        (GLM_EP32, (), 32, 32),
        (GEMMA4_EP32, (), 32, 32),
    ],
)
def test_nemo_rl_expert_parallel_recipes_validate_and_render(relative, overrides, ep, dp_shard):
    recipe, spec = planned(relative, *overrides)
    assert recipe.policy.automodel_cfg.expert_parallel_size == ep
    assert spec.layout is not None
    assert (spec.layout.ep, spec.layout.dp_shard, spec.layout.dp) == (ep, dp_shard, dp_shard)
    assert spec.layout.describe().endswith(f" × ep={ep}")
    assert "#SBATCH" in render_sbatch(spec)


def test_validate_says_that_blocks_are_not_compiled_under_expert_parallelism():
    with pytest.raises(ConfigError) as caught:  # a warning rides along with an error
        planned(SFT_EP4, "policy.dtensor_cfg.expert_parallel_size=3")
    warnings = {p.path: p.message for p in caught.value.problems if not p.is_error}
    assert "not compiled under expert parallelism" in warnings["policy.automodel_cfg.torch_compile"]


def test_an_expert_parallel_size_that_does_not_divide_the_shard_ranks_is_refused():
    found = plan_errors(SFT_EP4, "policy.dtensor_cfg.expert_parallel_size=3")
    assert found[EP] == (
        f"error: {EP} = 3: must divide the data-parallel shard size 4 (training ranks / "
        "(dp_replicate_size × tensor_parallel_size × context_parallel_size)): each expert "
        f"group is that many data-parallel ranks\n  fix: set {EP} to one of [2, 4]"
    )


@pytest.mark.parametrize(
    ("override", "what"),
    [
        ("policy.dtensor_cfg.tensor_parallel_size=2", "tensor parallelism"),
        ("++policy.automodel_cfg.dp_replicate_size=2", "HSDP replicas"),
        ("policy.dtensor_cfg.cpu_offload=true", "FSDP2's CPU offload"),
        ("++policy.automodel_cfg.optimizer_offload_fraction=0.5", "optimizer offload"),
        ("++policy.automodel_cfg.reference_on_host=true", "the host-resident reference model"),
        ("policy.dtensor_cfg.lora_cfg.enabled=true", "LoRA adapters"),
    ],
)
def test_expert_parallelism_with_layouts_it_is_not_built_for_is_refused(override, what):
    found = plan_errors(SFT_EP4, override)
    assert f"expert parallelism together with {what}" in found[EP]
    assert f"  fix: set {EP}=1, or " in found[EP]


def test_the_refusal_of_tensor_parallelism_beside_experts_reads_in_full():
    found = plan_errors(SFT_EP4, "policy.dtensor_cfg.tensor_parallel_size=2")
    assert found[EP] == (
        f"error: {EP} = 4: expert parallelism together with tensor parallelism "
        "(policy.automodel_cfg.tensor_parallel_size=2) is not supported by the automodel "
        f"backend yet\n  fix: set {EP}=1, or policy.automodel_cfg.tensor_parallel_size=1"
    )


def _recipe(ep: int, tp: int = 1):
    recipe = load_as_hpcrl(config_path(SFT_EP4)).recipe
    cfg = attrs.evolve(
        recipe.policy.automodel_cfg, expert_parallel_size=ep, tensor_parallel_size=tp
    )
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=cfg))


def test_a_model_without_experts_or_with_an_indivisible_count_is_refused_by_its_config():
    dense = architecture_problem(_recipe(4), {"model_type": "qwen2"})
    assert dense is not None and dense.path == EP and dense.value == 4
    assert (
        "has no experts the automodel backend can split" in dense.message
        and dense.fix == f"set {EP}=1"
    )

    uneven = architecture_problem(_recipe(4), {"model_type": "qwen3_moe", "num_experts": 6})
    assert uneven is not None and uneven.path == EP
    assert "does not divide the model's 6 experts" in uneven.message
    assert "one of [1, 2, 3, 6]" in uneven.fix

    tp_moe = architecture_problem(_recipe(1, tp=2), {"model_type": "mixtral"})
    assert tp_moe is not None
    assert tp_moe.path == "policy.automodel_cfg.tensor_parallel_size"

    fits = {"model_type": "mixtral", "num_local_experts": 8}
    assert architecture_problem(_recipe(4), fits) is None
    glm = {"model_type": "glm4_moe_lite", "n_routed_experts": 64}  # GLM-4.7-Flash's
    assert architecture_problem(_recipe(4), glm) is None
    glm_uneven = architecture_problem(_recipe(4), {**glm, "n_routed_experts": 6})
    assert glm_uneven is not None and "n_routed_experts in config.json" in glm_uneven.message
    # Gemma 4: the wrapper's count is in its text_config; its dense sizes have none (null)
    gemma4 = {"model_type": "gemma4", "text_config": {"num_experts": 128}}  # 26B-A4B's
    assert architecture_problem(_recipe(4), gemma4) is None
    uneven_gemma4 = architecture_problem(_recipe(4), {**gemma4, "text_config": {"num_experts": 6}})
    assert uneven_gemma4 is not None and "model's 6 experts" in uneven_gemma4.message
    dense_gemma4 = {"model_type": "gemma4", "text_config": {"num_experts": None}}  # 31B's
    dense = architecture_problem(_recipe(4), dense_gemma4)
    assert dense is not None and "has no experts the automodel backend can split" in dense.message
    assert architecture_problem(_recipe(1), dense_gemma4) is None
    assert architecture_problem(_recipe(1), {"model_type": "qwen2"}) is None


QWEN35_DAPO_EP32 = "recipes/llm/grpo-qwen3.5-35ba3b-dapo-4n8g-automodel.yaml"  # 4 × 8, ep 32


@pytest.mark.parametrize("relative", [GRPO_EP16, QWEN35_DAPO_EP32])
def test_nemo_rl_qwen3_5_moe_automodel_recipes_pass_the_architecture_check(relative, tmp_path):
    """Qwen3.5 MoE (qwen3_5_moe, from hpcrl's table: no config.json here) is built by the
    Automodel backend with transformers 5 (tests/transformers5/test_qwen3_5_moe.py), its
    nested router_aux_loss_coef override kept; a pack is refused (its Gated DeltaNet layers
    would carry state across the pack's sequences)."""
    from hpcrl.plan.architecture import architecture_note, check_model_architecture

    no_cache = {"HF_HUB_CACHE": str(tmp_path / "empty")}
    recipe, spec = planned(relative)
    assert recipe.policy.hf_config_overrides == {"text_config": {"router_aux_loss_coef": 0.0}}
    assert recipe.policy.automodel_cfg.activation_checkpointing
    assert check_model_architecture(recipe, spec, no_cache) == []
    note = architecture_note(recipe, spec, no_cache)
    assert note is not None and "'qwen3_5_moe'" in note and "transformers >= 5" in note
    assert architecture_problem(recipe, {"model_type": "qwen3_5_moe",
                                         "text_config": {"num_experts": 256}}) is None  # fmt: skip
    packed = load_as_hpcrl(
        config_path(relative),
        ["policy.sequence_packing.enabled=true", "policy.dynamic_batching.enabled=false"],
    ).recipe
    problem = architecture_problem(packed, {"model_type": "qwen3_5_moe"})
    assert problem is not None and problem.one_line() == (
        "policy.sequence_packing.enabled = True: model Qwen/Qwen3.5-35B-A3B-Base is a "
        "qwen3_5_moe model whose linear-attention (Gated DeltaNet) layers the automodel backend "
        "runs with transformers' torch path, which carries their state across a pack's "
        "sequence boundaries; fix: set policy.sequence_packing.enabled=false "
        "(policy.dynamic_batching.enabled=true batches by tokens without packing, as NeMo RL's "
        "Qwen3.5 recipes do)"
    )
