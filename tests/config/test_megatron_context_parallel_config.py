"""``policy.megatron_cfg.context_parallel_size`` as NeMo RL's own recipes set it: accepted, laid
out as tp × pp × cp × dp and rendered against the eos profile; packs cut to 2·CP. The training
itself: tests/megatron/test_context_parallel.py."""

from __future__ import annotations

import attrs

from hpcrl.config import load_profile
from hpcrl.core.workers.micro_batches import BatchingSettings
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl
from tests.recipe_builder import tiny_megatron_recipe

SFT_CP2 = "recipes/llm/sft-qwen2.5-math7b-2n8g-megatron.yaml"  # 2 × 8 GPUs, tp 4, cp 2, packed


def test_nemo_rl_sft_cp2_recipe_validates_lays_out_and_renders():
    recipe = load_as_hpcrl(config_path(SFT_CP2), []).recipe
    cfg = recipe.policy.megatron_cfg
    assert (cfg.context_parallel_size, cfg.tensor_model_parallel_size) == (2, 4)
    assert recipe.policy.sequence_packing.enabled
    spec = plan(recipe, load_profile("eos"), run_dir="/runs/cp", recipe_source="cp.yaml")
    assert spec.layout is not None
    # NeMo RL's split: 16 GPUs = TP 4 × PP 1 × CP 2 × DP 2.
    assert (spec.layout.tp, spec.layout.pp, spec.layout.cp, spec.layout.dp) == (4, 1, 2, 2)
    assert spec.layout.describe() == "tp=4 × pp=1 × cp=2 × dp=2"
    assert "#SBATCH --nodes=2" in render_sbatch(spec)


def test_packs_and_their_sequences_divide_into_two_cp_chunks():
    recipe = tiny_megatron_recipe("tiny", cp=4)
    packing = attrs.evolve(recipe.policy.sequence_packing, enabled=True, sequence_length_round=6)
    policy = attrs.evolve(
        recipe.policy, sequence_packing=packing, make_sequence_length_divisible_by=3
    )
    settings = BatchingSettings.from_recipe(attrs.evolve(recipe, policy=policy), "train")
    assert (settings.mode, settings.divisible_by, settings.round_to) == ("packed", 24, 24)
    without_cp = BatchingSettings.from_recipe(tiny_megatron_recipe("tiny"), "train")
    assert without_cp.divisible_by == 1
