"""The job's side of the architecture check: a model validate could not read (here: a local
folder under no look of the planner) and its backend cannot build stops the driver as it
starts, with the named message and the plan-error exit code, before any worker or data."""

from __future__ import annotations

import json

import attrs

from hpcrl.config.recipe import GenerationCfg
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
        "qwen2_moe, gemma3_text, gemma3, mistral3, gemma4, glm4_moe_lite decoders; fix: train "
        "it with the "
        "Megatron backend (policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false), "
        "or pick a model of one of these types\n"
    )


def test_a_transformers5_only_model_stops_the_job_when_its_transformers_lacks_it(tmp_path):
    """glm4_moe_lite (GLM-4.7-Flash) is built by transformers >= 5 only: under this Python's
    transformers 4 the job's check refuses it by name, as it starts."""
    import transformers

    from hpcrl.core.models.buildable import unbuildable_model

    folder = tmp_path / "glm"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "glm4_moe_lite", "architectures": ["Glm4MoeLiteForCausalLM"]})
    )
    recipe = with_policy(
        automodel_recipe(), model_name=str(folder), generation=GenerationCfg(backend="vllm")
    )
    assert transformers.__version__.startswith("4.")
    problem = unbuildable_model(recipe, str(folder))
    assert problem is not None and problem.one_line() == (
        f"policy.model_name = '{folder}': a glm4_moe_lite model, which the automodel backend "
        f"builds with transformers >= 5; this job's Python has transformers "
        f"{transformers.__version__}, which lacks it; fix: run the job in a container whose "
        "Python has transformers >= 5, or train it with the Megatron backend "
        "(policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false)"
    )
