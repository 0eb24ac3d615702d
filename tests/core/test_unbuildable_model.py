"""The job's side of the architecture check: a model validate could not read (here: a local
folder under no look of the planner) and its backend cannot build stops the driver as it
starts, with the named message and the plan-error exit code, before any worker or data
(as does the Megatron backend's refusal of a model that processes its logits)."""

from __future__ import annotations

import json
from functools import partial

import attrs

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.driver import PLAN_ERROR_EXIT_CODE, train_recipe
from hpcrl.plan.planner import plan
from tests.plan.planning_inputs import local_profile
from tests.recipe_builder import automodel_recipe, megatron_recipe, with_policy


def refused(
    tmp_path, config: dict, capsys, generation: str = "torch", backend=automodel_recipe
) -> str:
    """What the driver prints as it refuses a local model folder with this config.json."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    recipe = with_policy(
        backend(), model_name=str(folder), train_global_batch_size=8,
        generation=GenerationCfg(backend=generation),
    )  # fmt: skip
    recipe = attrs.evolve(recipe, cluster=attrs.evolve(recipe.cluster, gpus_per_node=2))
    run_dir = tmp_path / "run"
    spec = plan(recipe, local_profile(), run_dir=str(run_dir), recipe_source="t")
    run_dir.mkdir()
    assert train_recipe(spec, run_dir) == PLAN_ERROR_EXIT_CODE
    return capsys.readouterr().err.replace(str(folder), "MODEL")


def test_the_driver_refuses_a_model_its_backend_cannot_build_by_name(tmp_path, capsys):
    err = refused(
        tmp_path, {"model_type": "minimax_m2", "architectures": ["MiniMaxM2ForCausalLM"]}, capsys
    )
    assert err == (
        "hpcrl: policy.model_name = 'MODEL': a MiniMaxM2ForCausalLM (model_type 'minimax_m2') "
        "model, "
        "which hpcrl's Automodel backend (policy.automodel_cfg) cannot build: it builds llama, "
        "qwen2, qwen3, mistral, qwen3_moe, mixtral, deepseek_v3, nemotron_h, glm4_moe_lite, "
        "gemma4, qwen3_5_moe, gpt_oss, glm4_moe, qwen2_moe, gemma3_text, gemma3, mistral3 "
        "decoders; "
        "fix: train it with the Megatron backend "
        "(policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false), or pick a "
        "model of one of these types\n"
    )


def test_the_driver_refuses_logit_processing_on_megatron_before_any_worker(tmp_path, capsys):
    """Granite divides its logits by ``logits_scaling``; the Megatron log-prob path would not
    (the Megatron worker refused it once its parallel state was set up)."""
    config = {"model_type": "granite", "architectures": ["GraniteForCausalLM"],
              "logits_scaling": 8.0}  # fmt: skip
    one_node = partial(megatron_recipe, num_nodes=1)
    assert refused(tmp_path, config, capsys, generation="vllm", backend=one_node) == (
        "hpcrl: policy.model_name = 'MODEL': this model post-processes its logits "
        "(logits_scaling 8), which the Megatron backend does not reproduce in its log-prob "
        "path; fix: pick a model without it: the Automodel backend, which applies it, does "
        "not build model_type 'granite' either\n"
    )


def test_the_driver_refuses_nemotron_h_where_transformers_lacks_it(tmp_path, capsys):
    """.venv keeps transformers 4 (megatron-bridge 0.3); Nemotron-H came with transformers 5,
    which tests/transformers5 build it with."""
    import transformers

    assert int(transformers.__version__.split(".")[0]) < 5, "run this test in .venv"
    config = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"]}
    assert refused(tmp_path, config, capsys, generation="vllm") == (
        "hpcrl: policy.model_name = 'MODEL': a 'nemotron_h' model, which transformers "
        f"{transformers.__version__} in the job's Python cannot build (its classes came with "
        "transformers 5); fix: give the profile a container image with transformers 5 or "
        "newer (NeMo RL's containers ship transformers 5)\n"
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
        f"policy.model_name = '{folder}': a 'glm4_moe_lite' model, which transformers "
        f"{transformers.__version__} in the job's Python cannot build (its classes came with "
        "transformers 5); fix: give the profile a container image with transformers 5 or "
        "newer (NeMo RL's containers ship transformers 5)"
    )
