"""A model whose architecture the recipe's backend cannot build (NeMo RL's MiniMax-M2 recipes on
the Automodel backend; its NemotronH recipes on hpcrl's in-process sampler) is refused by name: at plan time when its config.json is readable here
(a local folder, or the job's Hugging Face cache) or hpcrl's table of NeMo RL's models lists
it, else by the job as it starts, with the same message; ``validate`` says which happens."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.models.buildable import unbuildable_model
from hpcrl.plan.architecture import architecture_note, check_model_architecture
from hpcrl.plan.planner import plan
from tests.plan.planning_inputs import local_profile
from tests.recipe_builder import automodel_recipe, megatron_recipe, with_policy

NEMOTRON_H = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"]}
MINIMAX = {"model_type": "minimax_m2", "architectures": ["MiniMaxM2ForCausalLM"]}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
AUTOMODEL_REFUSAL = (
    "policy.model_name = '{name}': a MiniMaxM2ForCausalLM (model_type 'minimax_m2') model, "
    "which hpcrl's Automodel backend (policy.automodel_cfg) cannot build: it builds llama, "
    "qwen2, qwen3, mistral, qwen3_moe, mixtral, deepseek_v3, nemotron_h, glm4_moe_lite, "
    "gemma4, qwen3_5_moe, gpt_oss, glm4_moe, qwen2_moe, gemma3_text, gemma3, mistral3 decoders; "
    "fix: "
    "train it with the Megatron backend "
    "(policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false), or pick a model "
    "of one of these types"
)


def model_folder(root: Path, config: dict) -> str:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    return str(root)


def planned(recipe, tmp_path):
    small = attrs.evolve(recipe, cluster=attrs.evolve(recipe.cluster, num_nodes=1, gpus_per_node=2))
    small = with_policy(small, train_global_batch_size=8)
    return small, plan(small, local_profile(), run_dir=str(tmp_path / "run"), recipe_source="t")


def test_a_local_minimax_folder_is_refused_for_the_automodel_backend(tmp_path):
    name = model_folder(tmp_path / "minimax", MINIMAX)
    recipe, spec = planned(with_policy(automodel_recipe(), model_name=name), tmp_path)
    (problem,) = check_model_architecture(recipe, spec, {})
    assert problem.one_line() == AUTOMODEL_REFUSAL.format(name=name)
    # the job, had validate not seen the file, refuses it with the same words
    assert unbuildable_model(recipe, name) == problem


def test_a_model_in_the_jobs_hub_cache_is_read(tmp_path):
    snapshot = tmp_path / "hub" / "models--MiniMaxAI--mm" / "snapshots" / "abc123"
    model_folder(snapshot, MINIMAX)
    recipe, spec = planned(with_policy(automodel_recipe(), model_name="MiniMaxAI/mm"), tmp_path)
    environ = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    (problem,) = check_model_architecture(recipe, spec, environ)
    assert problem.path == "policy.model_name" and "minimax_m2" in problem.message
    assert check_model_architecture(recipe, spec, {"HF_HUB_CACHE": str(tmp_path / "none")}) == []


def test_the_in_process_sampler_refuses_it_under_megatron_and_vllm_does_not(tmp_path):
    name = model_folder(tmp_path / "nemotron", NEMOTRON_H)
    recipe = with_policy(megatron_recipe(), model_name=name)
    megatron_generation = with_policy(recipe, generation=GenerationCfg(backend="megatron"))
    recipe, spec = planned(megatron_generation, tmp_path)
    (problem,) = check_model_architecture(recipe, spec, {})
    assert problem.message == (
        "a NemotronHForCausalLM (model_type 'nemotron_h') model, which hpcrl's in-process "
        "sampler (policy.generation.backend megatron) cannot build: it builds llama, qwen2, "
        "qwen3, mistral decoders"
    )
    assert problem.fix == "set policy.generation.backend=vllm"
    vllm = with_policy(recipe, generation=GenerationCfg(backend="vllm"))
    assert check_model_architecture(vllm, spec, {}) == []  # megatron-bridge and vLLM decide


def test_validate_says_where_the_architecture_is_checked(tmp_path):
    name = model_folder(tmp_path / "llama", LLAMA)
    recipe, spec = planned(with_policy(automodel_recipe(), model_name=name), tmp_path)
    assert check_model_architecture(recipe, spec, {}) == []
    assert architecture_note(recipe, spec, {}) == (
        "architecture: 'llama' (config.json), built by hpcrl's Automodel backend (policy.automodel_cfg), "
        "hpcrl's in-process sampler (policy.generation.backend torch)"
    )
    hub_name = with_policy(recipe, model_name="nvidia/Nano")
    assert architecture_note(hub_name, spec, {"HF_HUB_CACHE": str(tmp_path)}) == (
        "architecture: the config.json of nvidia/Nano is not readable here (no local folder, "
        "not in the job's Hugging Face cache) and hpcrl's table of NeMo RL's models does not "
        "list it, so the job checks the architecture as it starts"
    )


NANO_V3 = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-Base-BF16"
MINIMAX_M2 = "MiniMaxAI/MiniMax-M2.7"


def test_a_hub_name_without_its_config_json_is_refused_from_the_table(tmp_path):
    recipe, spec = planned(with_policy(automodel_recipe(), model_name=MINIMAX_M2), tmp_path)
    no_cache = {"HF_HUB_CACHE": str(tmp_path / "empty")}
    (problem,) = check_model_architecture(recipe, spec, no_cache)
    # the words of the config.json-based refusal, word for word
    assert problem.one_line() == AUTOMODEL_REFUSAL.format(name=MINIMAX_M2)
    assert architecture_note(recipe, spec, no_cache) == (
        "architecture: 'minimax_m2' (hpcrl's table of NeMo RL's models), built by hpcrl's "
        "Automodel backend (policy.automodel_cfg), hpcrl's in-process sampler "
        "(policy.generation.backend torch)"
    )


def test_validate_says_nemotron_h_needs_transformers_5_in_the_job(tmp_path):
    vllm = with_policy(
        automodel_recipe(), model_name=NANO_V3, generation=GenerationCfg(backend="vllm")
    )
    recipe, spec = planned(vllm, tmp_path)
    no_cache = {"HF_HUB_CACHE": str(tmp_path / "empty")}
    assert check_model_architecture(recipe, spec, no_cache) == []
    assert architecture_note(recipe, spec, no_cache) == (
        "architecture: 'nemotron_h' (hpcrl's table of NeMo RL's models), built by hpcrl's "
        "Automodel backend (policy.automodel_cfg) with transformers 5's classes: the job's "
        "Python needs transformers >= 5 (NeMo RL's containers have it; the job stops at start "
        "without it)"
    )


def test_a_readable_config_json_wins_over_the_table(tmp_path):
    snapshot = tmp_path / "hub" / f"models--{NANO_V3.replace('/', '--')}" / "snapshots" / "a1"
    model_folder(snapshot, LLAMA)
    recipe, spec = planned(with_policy(automodel_recipe(), model_name=NANO_V3), tmp_path)
    assert check_model_architecture(recipe, spec, {"HF_HUB_CACHE": str(tmp_path / "hub")}) == []


def test_an_fsdp_only_decoder_from_the_table_needs_tensor_parallel_size_1(tmp_path):
    moonlight = with_policy(
        automodel_recipe(),
        model_name="moonshotai/Moonlight-16B-A3B-Instruct",
        generation=GenerationCfg(backend="vllm"),
    )
    no_cache = {"HF_HUB_CACHE": str(tmp_path / "empty")}
    recipe, spec = planned(moonlight, tmp_path)
    assert check_model_architecture(recipe, spec, no_cache) == []
    cfg = attrs.evolve(recipe.policy.automodel_cfg, tensor_parallel_size=2)
    split = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=cfg))
    (problem,) = check_model_architecture(split, spec, no_cache)
    assert problem.one_line() == (
        "policy.automodel_cfg.tensor_parallel_size = 2: model "
        "moonshotai/Moonlight-16B-A3B-Instruct is a deepseek_v3 decoder, which the automodel "
        "backend shards with FSDP alone: its tensor-parallel plan is made for llama, qwen2, "
        "qwen3, mistral, qwen3_moe, mixtral, gemma3_text, gemma3 decoders; fix: set "
        "policy.automodel_cfg.tensor_parallel_size=1, or train it with the Megatron backend "
        "(policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false)"
    )
    cp = attrs.evolve(recipe.policy.automodel_cfg, context_parallel_size=2)
    (context,) = check_model_architecture(
        attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=cp)), spec, no_cache
    )
    assert (context.path, context.value) == ("policy.automodel_cfg.context_parallel_size", 2)
    assert context.message.endswith(
        "FSDP alone: context parallelism is not tested on these decoders"
    )


def test_gemma3s_multimodal_wrapper_from_the_table_trains_with_tp_but_no_cp_or_lora(tmp_path):
    gemma = with_policy(
        automodel_recipe(), model_name="google/gemma-3-27b-it",
        generation=GenerationCfg(backend="vllm"),
    )  # fmt: skip
    no_cache = {"HF_HUB_CACHE": str(tmp_path / "empty")}
    recipe, spec = planned(gemma, tmp_path)
    assert check_model_architecture(recipe, spec, no_cache) == []
    # NeMo RL's gemma-3-27b-it recipes: TP 4 and 8 (tests/core/test_gemma3_tp.py), with
    # sequence parallelism too; context parallelism stays refused
    for tp_size in (4, 8):
        tp = attrs.evolve(
            recipe.policy.automodel_cfg, tensor_parallel_size=tp_size, sequence_parallel=True
        )
        tp_recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=tp))
        assert check_model_architecture(tp_recipe, spec, no_cache) == []
    cp = attrs.evolve(recipe.policy.automodel_cfg, context_parallel_size=2)
    (split,) = check_model_architecture(
        attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=cp)), spec, no_cache
    )
    assert (split.path, split.value) == ("policy.automodel_cfg.context_parallel_size", 2)
    assert split.message.endswith(
        "shards with FSDP and tensor parallelism: context parallelism is not tested on these "
        "decoders"
    )
    lora = attrs.evolve(
        recipe.policy.automodel_cfg,
        lora_cfg=attrs.evolve(recipe.policy.automodel_cfg.lora_cfg, enabled=True),
    )
    (adapted,) = check_model_architecture(
        attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=lora)), spec, no_cache
    )
    assert adapted.one_line() == (
        "policy.automodel_cfg.lora_cfg.enabled = True: model google/gemma-3-27b-it is a "
        "multimodal gemma3 wrapper whose text decoder the automodel backend trains in full: LoRA "
        "on it is not tested; fix: set policy.automodel_cfg.lora_cfg.enabled=false, or train it "
        "with the Megatron backend (policy.megatron_cfg.enabled=true, "
        "policy.automodel_cfg.enabled=false)"
    )


def test_validate_accepts_glm_4_7_flash_and_says_the_job_needs_transformers_5(tmp_path):
    glm = with_policy(
        automodel_recipe(), model_name="zai-org/GLM-4.7-Flash",
        generation=GenerationCfg(backend="vllm"),
    )  # fmt: skip
    no_cache = {"HF_HUB_CACHE": str(tmp_path / "empty")}
    recipe, spec = planned(glm, tmp_path)
    assert check_model_architecture(recipe, spec, no_cache) == []
    assert architecture_note(recipe, spec, no_cache) == (
        "architecture: 'glm4_moe_lite' (hpcrl's table of NeMo RL's models), built by hpcrl's "
        "Automodel backend (policy.automodel_cfg) with transformers 5's classes: the job's "
        "Python needs transformers >= 5 (NeMo RL's containers have it; the job stops at start "
        "without it)"
    )


def test_gpt_oss_20b_from_the_table_trains_only_dequantized():
    """NeMo RL's sft-gpt-oss-20b recipes: the table knows its experts are MXFP4."""
    from hpcrl.config.architectures import architecture_problem
    from hpcrl.config.hf_model_table import known_hf_config
    from tests.recipe_builder import tiny_automodel_recipe

    table = known_hf_config("openai/gpt-oss-20b")
    assert table is not None and table["quantization_config"] == {"quant_method": "mxfp4"}
    sft = with_policy(tiny_automodel_recipe(), model_name="openai/gpt-oss-20b")
    problem = architecture_problem(sft, table)
    assert problem is not None
    assert (problem.path, problem.value) == ("policy.dequantize_base_checkpoint", False)
    assert problem.fix == (
        "set policy.dequantize_base_checkpoint=true (as NeMo RL's gpt-oss recipes do)"
    )
    dequantized = with_policy(sft, dequantize_base_checkpoint=True)
    assert architecture_problem(dequantized, table) is None


GEMMA2 = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"],
          "final_logit_softcapping": 30.0}  # fmt: skip
#: Gemma 3's multimodal wrapper, its decoder soft-capping (its released configs do not)
GEMMA3_SOFTCAPPED = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                     "text_config": {"model_type": "gemma3_text", "final_logit_softcapping": 30.0,
                                     "logit_scale": 1}}  # fmt: skip


def test_megatron_refuses_a_model_that_processes_its_logits_before_any_worker(tmp_path):
    """Was refused by the Megatron worker after its parallel state was set up (in the queue's
    time); now by validate when it sees config.json, else by the job before any worker."""
    name = model_folder(tmp_path / "gemma2", GEMMA2)
    vllm = GenerationCfg(backend="vllm")  # no builder of hpcrl's reads the config
    recipe, spec = planned(
        with_policy(megatron_recipe(), model_name=name, generation=vllm), tmp_path
    )
    (problem,) = check_model_architecture(recipe, spec, {})
    assert problem.one_line() == (
        f"policy.model_name = '{name}': this model post-processes its logits "
        "(final_logit_softcapping 30), which the Megatron backend does not reproduce in its "
        "log-prob path; fix: pick a model without it: the Automodel backend, which applies "
        "it, does not build model_type 'gemma2' either"
    )
    assert unbuildable_model(recipe, name) == problem
    wrapped = model_folder(tmp_path / "gemma3", GEMMA3_SOFTCAPPED)
    (problem,) = check_model_architecture(with_policy(recipe, model_name=wrapped), spec, {})
    assert "(final_logit_softcapping 30)" in problem.message
    assert problem.fix.startswith("train it with the Automodel backend")
    # plain logits pass, as does the same soft-capped model on the Automodel backend
    plain = model_folder(tmp_path / "llama", {**LLAMA, "logit_scale": 1.0})
    assert check_model_architecture(with_policy(recipe, model_name=plain), spec, {}) == []
    automodel = with_policy(automodel_recipe(), model_name=wrapped, generation=vllm)
    automodel, spec = planned(automodel, tmp_path)
    assert check_model_architecture(automodel, spec, {}) == []
