"""The job's side of the architecture check: a model validate could not read (here: a local
folder under no look of the planner) and its backend cannot build stops the driver as it
starts, with the named message and the plan-error exit code, before any worker or data."""

from __future__ import annotations

import json

import attrs

from hpcrl.core.driver import PLAN_ERROR_EXIT_CODE, train_recipe
from hpcrl.plan.planner import plan
from tests.plan.planning_inputs import local_profile
from tests.recipe_builder import automodel_recipe, with_policy


def test_the_driver_refuses_a_nemotron_h_model_by_name(tmp_path, capsys):
    folder = tmp_path / "nemotron"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"]})
    )
    recipe = with_policy(automodel_recipe(), model_name=str(folder), train_global_batch_size=8)
    recipe = attrs.evolve(recipe, cluster=attrs.evolve(recipe.cluster, gpus_per_node=2))
    run_dir = tmp_path / "run"
    spec = plan(recipe, local_profile(), run_dir=str(run_dir), recipe_source="t")
    run_dir.mkdir()
    assert train_recipe(spec, run_dir) == PLAN_ERROR_EXIT_CODE
    assert capsys.readouterr().err == (
        f"hpcrl: policy.model_name = '{folder}': a NemotronHForCausalLM (model_type "
        "'nemotron_h') model, which hpcrl's Automodel backend (policy.automodel_cfg) cannot "
        "build: it builds llama, qwen2, qwen3, mistral, qwen3_moe, mixtral, deepseek_v3, glm4_moe, "
        "qwen2_moe, gemma3_text, gemma3, mistral3 decoders; fix: train "
        "it with the "
        "Megatron backend (policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false), "
        "or pick a model of one of these types\n"
    )
