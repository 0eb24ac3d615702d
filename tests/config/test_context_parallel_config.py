"""``policy.dtensor_cfg.context_parallel_size`` (hpcrl's ``policy.automodel_cfg.context_parallel_size``)
as NeMo RL's own DAPO recipes set it: accepted, laid out (CP counted in the GPU split) and
rendered; refused by path, value and fix with what NeMo RL refuses beside it (sequence
packing; sequence parallelism at TP > 1) and with what hpcrl cannot do (expert parallelism).
The training itself: tests/core/test_parallel_cp.py and tests/core/test_context_parallel.py.
"""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError, load_profile
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

# Loaded from a NeMo RL config, problems name its keys (dtensor_cfg, not automodel_cfg).
CP = "policy.dtensor_cfg.context_parallel_size"
DAPO_CP4 = "recipes/llm/dapo-qwen2.5-7b.v2.yaml"  # 16 nodes × 8 GPUs, cp 4
DAPO_CP2 = "recipes/llm/dapo-qwen2.5-7b-16n4g-fsdp2cp2.v2.yaml"


def planned(relative: str, *overrides: str):
    recipe = load_as_hpcrl(config_path(relative), list(overrides)).recipe
    return recipe, plan(recipe, load_profile("eos"), run_dir="/runs/cp", recipe_source="cp.yaml")


def plan_errors(relative: str, *overrides: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        planned(relative, *overrides)
    return {problem.path: problem.format() for problem in caught.value.errors}


@pytest.mark.parametrize("relative", [DAPO_CP4, DAPO_CP2])
def test_nemo_rl_dapo_context_parallel_recipes_validate_and_render(relative):
    recipe, spec = planned(relative)
    cp = recipe.policy.automodel_cfg.context_parallel_size
    assert cp > 1
    layout = spec.layout
    assert layout is not None
    assert layout.cp == cp
    assert layout.world_size == layout.dp_replicate * layout.dp_shard * layout.tp * cp
    assert f"cp={cp}" in layout.describe()
    assert "#SBATCH" in render_sbatch(spec)


def test_dapo_cp4_splits_128_gpus_into_32_data_parallel_ranks():
    _, spec = planned(DAPO_CP4)
    assert spec.layout.describe() == "dp_replicate=1 × dp_shard=32 × tp=1 × cp=4"
    assert spec.layout.dp == 32  # CP peers share rows: the batch splits over 32 ranks


def test_context_parallelism_with_sequence_packing_is_refused():
    found = plan_errors(DAPO_CP4, "policy.sequence_packing.enabled=true")
    assert found[CP].startswith(f"error: {CP} = 4: context parallelism does not run with ")
    assert "fix: set policy.sequence_packing.enabled=false" in found[CP]


def test_context_parallelism_with_sequence_parallel_tp_is_refused():
    found = plan_errors(
        DAPO_CP4,
        "policy.dtensor_cfg.tensor_parallel_size=2",
        "policy.dtensor_cfg.sequence_parallel=true",
    )
    assert "sequence_parallel at tensor_parallel_size > 1" in found[CP]
    assert f"set policy.dtensor_cfg.sequence_parallel=false, or {CP}=1" in found[CP]


def test_context_parallelism_with_expert_parallelism_is_refused():
    found = plan_errors(DAPO_CP4, "policy.dtensor_cfg.expert_parallel_size=2")
    path = "policy.automodel_cfg.expert_parallel_size"  # plan-time: hpcrl's own key names
    assert "together with context parallelism" in found[path]
    assert f"fix: set {path}=1, or policy.automodel_cfg.context_parallel_size=1" in found[path]
