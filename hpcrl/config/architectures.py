"""Which Hugging Face model architectures each part of hpcrl can build, read from a model's
``config.json`` (its ``model_type`` and ``architectures``), and the refusal when a recipe
names one its backend cannot build. Text only: the login node reads the file when it can see
it (``hpcrl.plan.architecture``), the job when it starts (``hpcrl.core.driver``), with the
same message.

- The Automodel backend trains a Hugging Face causal LM with its own tensor-parallel plan of
  q/k/v/o and gate/up/down projections over ``model.layers``
  (``hpcrl.core.backends.automodel.parallelize``): Llama-shaped decoders, and the MoE blocks
  of ``MOE_EXPERT_COUNT_KEYS`` split over expert-parallel ranks. FSDP2 alone shards any
  decoder's blocks the same way, so the decoders of ``FSDP_ONLY_MODEL_TYPES`` (which
  transformers builds itself, with SDPA attention) train too at tensor_parallel_size 1
  (Gemma 3's, ``TP_GEMMA3``, at any size: the plan fits its blocks)
  without expert parallelism (deepseek_v3, nemotron_h, glm4_moe_lite also with it):
  tests/core/test_fsdp_only_models.py builds each one (those transformers 5 brought:
  tests/transformers5).
- Multimodal wrappers of a text decoder (``MULTIMODAL_TEXT_MODEL_TYPES``: Gemma 3, Mistral 3,
  Gemma 4, Qwen3.5 MoE) load whole as NeMo RL loads them, train their language model on text
  with the vision part frozen, FSDP2 alone (Gemma 3's also with tensor parallelism, Gemma 4
  MoE and Qwen3.5 MoE also with expert parallelism), no LoRA
  (hpcrl.core.backends.automodel.multimodal; tests/core/test_multimodal_text_models.py,
  tests/transformers5/test_gemma4.py, test_qwen3_5_moe.py). Qwen3.5's linear-attention layers
  are not packed (``NO_PACKING_MODEL_TYPES``).
- An MXFP4 checkpoint (gpt-oss) trains on the Automodel backend only dequantized to bf16 as it
  loads (``policy.dequantize_base_checkpoint``, ``DEQUANTIZED_ON_LOAD``).
- hpcrl's torch sampler (``policy.generation.backend`` torch, and megatron, which samples
  with it) implements the same decoders (``hpcrl.core.generation.decoder``).
- The Megatron backend's models come from megatron-bridge, which decides itself; vLLM too.
  One refusal is hpcrl's own: a model whose Hugging Face forward rescales or soft-caps
  lm_head's output (``LOGIT_MULTIPLIER_KEYS``, ``final_logit_softcapping``: Gemma 2, Granite,
  Cohere, Falcon-H1), whose log-probs the Megatron backend does not reproduce.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

#: model_type values of the Llama-shaped decoders both builders implement
LLAMA_SHAPED = ("llama", "qwen2", "qwen3", "mistral")
#: MoE decoders of the same shape whose Hugging Face MoE blocks the Automodel backend can
#: split over expert-parallel ranks (hpcrl.core.backends.automodel.expert_parallel), with
#: the config key holding the expert count (a multimodal wrapper's: in its ``text_config``;
#: gemma4: the MoE Gemma 4, gemma-4-26B-A4B; its dense sizes have no experts, null there)
MOE_EXPERT_COUNT_KEYS = {
    "qwen3_moe": "num_experts", "mixtral": "num_local_experts",
    "deepseek_v3": "n_routed_experts", "nemotron_h": "n_routed_experts",
    "glm4_moe_lite": "n_routed_experts", "gemma4": "num_experts", "qwen3_5_moe": "num_experts",
    "gpt_oss": "num_local_experts",
}  # fmt: skip
#: decoders the Automodel backend shards with FSDP2 alone: no tensor-parallel plan (their
#: attention, MoE or extra-norm blocks are not Llama-shaped), no context parallelism, and no
#: expert parallelism unless ``MOE_EXPERT_COUNT_KEYS`` lists them (deepseek_v3, glm4_moe_lite,
#: nemotron_h: Nemotron-H's Mamba-2/attention/MLP or MoE hybrid, transformers 5 only;
#: gpt_oss: attention sinks, which transformers runs in its eager attention, not SDPA).
FSDP_ONLY_MODEL_TYPES = (
    "deepseek_v3", "glm4_moe", "qwen2_moe", "gemma3_text", "nemotron_h", "glm4_moe_lite",
    "gpt_oss",
)  # fmt: skip
#: multimodal wrappers whose text decoder the Automodel backend trains on text, as NeMo RL
#: does (hpcrl.core.backends.automodel.multimodal), with FSDP2 alone like the decoders above
MULTIMODAL_TEXT_MODEL_TYPES = ("gemma3", "mistral3", "gemma4", "qwen3_5_moe")
#: model types whose transformers classes came with transformers 5 (NeMo RL's containers ship
#: 5.x): validate accepts them (it cannot see the job's Python) and says so; the job refuses
#: them at start under an older one (``hpcrl.core.models.buildable``)
TRANSFORMERS_5_MODEL_TYPES = ("nemotron_h", "glm4_moe_lite", "gemma4", "qwen3_5_moe")
#: decoders with recurrent (linear-attention) layers whose state transformers' torch path
#: carries across a pack's sequence boundaries (Qwen3.5's Gated DeltaNet: its kernels would
#: need ``cu_seqlens``, which only flash-linear-attention honours): no sequence packing
NO_PACKING_MODEL_TYPES = ("qwen3_5_moe",)
AUTOMODEL_MODEL_TYPES = tuple(
    dict.fromkeys((
        *LLAMA_SHAPED, *MOE_EXPERT_COUNT_KEYS, *FSDP_ONLY_MODEL_TYPES,
        *MULTIMODAL_TEXT_MODEL_TYPES,
    ))
)  # fmt: skip
#: MoE decoders of Llama-shaped attention: the tensor-parallel plan's names fit them
TP_MOE = ("qwen3_moe", "mixtral")
#: Gemma 3's decoder, alone and in its multimodal wrapper: FSDP-only otherwise (no context
#: parallelism), but its projections are Llama's and the tensor-parallel plan fits them
#: (tests/core/test_gemma3_tp.py)
TP_GEMMA3 = ("gemma3_text", "gemma3")

#: quant_method values of checkpoints the Automodel backend loads dequantized with
#: ``policy.dequantize_base_checkpoint`` (transformers' Mxfp4Config(dequantize=True))
DEQUANTIZED_ON_LOAD = ("mxfp4",)
DEQUANTIZE = "policy.dequantize_base_checkpoint"
TENSOR_PARALLEL = "policy.automodel_cfg.tensor_parallel_size"
CONTEXT_PARALLEL = "policy.automodel_cfg.context_parallel_size"
EXPERT_PARALLEL = "policy.automodel_cfg.expert_parallel_size"
SAMPLER_MODEL_TYPES = LLAMA_SHAPED
MODEL = "policy.model_name"
#: config keys whose value multiplies (False) or divides (True) lm_head's output in the
#: Hugging Face forward (Cohere's logit_scale, Granite's logits_scaling, Falcon-H1's
#: lm_head_multiplier); ``final_logit_softcapping`` then soft-caps it (Gemma 2)
LOGIT_MULTIPLIER_KEYS = (
    ("logit_scale", False),
    ("logits_scaling", True),
    ("lm_head_multiplier", False),
)
LOGIT_SOFTCAP_KEY = "final_logit_softcapping"


def builders(recipe: Recipe) -> list[tuple[str, tuple[str, ...], str]]:
    """(what builds the model, the model_types it builds, the fix) for each part of hpcrl
    that will build ``recipe``'s model from its Hugging Face config."""
    found: list[tuple[str, tuple[str, ...], str]] = []
    if recipe.backend == "automodel":
        found.append((
            "hpcrl's Automodel backend (policy.automodel_cfg)", AUTOMODEL_MODEL_TYPES,
            "train it with the Megatron backend (policy.megatron_cfg.enabled=true, "
            "policy.automodel_cfg.enabled=false), or pick a model of one of these types",
        ))  # fmt: skip
    generation = recipe.policy.generation.backend
    if recipe.algorithm == "grpo" and generation in ("torch", "megatron"):
        found.append((
            f"hpcrl's in-process sampler (policy.generation.backend {generation})",
            SAMPLER_MODEL_TYPES, "set policy.generation.backend=vllm",
        ))  # fmt: skip
    return found


def architecture_problem(recipe: Recipe, hf_config: Mapping[str, Any]) -> Problem | None:
    """The refusal of a model ``recipe``'s backend cannot build, None when it can."""
    model_type = hf_config.get("model_type")
    for builder, model_types, fix in builders(recipe):
        if model_type in model_types:
            continue
        architectures = hf_config.get("architectures") or []
        named = f"{architectures[0]} (model_type {model_type!r})" if architectures else (
            f"model_type {model_type!r}"
        )  # fmt: skip
        return Problem(
            path=MODEL,
            value=recipe.policy.model_name,
            message=f"a {named} model, which {builder} cannot build: it builds "
            f"{', '.join(model_types)} decoders",
            fix=fix,
        )
    if recipe.backend == "megatron":
        return logit_processing_problem(recipe, hf_config)
    if recipe.backend == "automodel":
        return (
            _fsdp_only_problem(recipe, hf_config)
            or _moe_layout_problem(recipe, hf_config)
            or _packing_problem(recipe, hf_config)
            or _quantized_problem(recipe, hf_config)
        )
    return None


def config_checked(recipe: Recipe) -> bool:
    """Whether anything refuses models by their config.json for ``recipe`` (a builder of
    ``builders``, or the Megatron backend's refusal of logit processing)."""
    return bool(builders(recipe)) or recipe.backend == "megatron"


def logit_processing(hf_config: Mapping[str, Any]) -> dict[str, float]:
    """What the Hugging Face forward does to lm_head's output, read from config.json (a
    multimodal wrapper's from its ``text_config``): the keys of ``LOGIT_MULTIPLIER_KEYS``
    and ``LOGIT_SOFTCAP_KEY`` that change it, with their values; empty for plain logits."""
    text = hf_config.get("text_config")
    text = text if isinstance(text, Mapping) else hf_config
    found = {
        name: float(value)
        for name, _ in LOGIT_MULTIPLIER_KEYS
        if isinstance(value := text.get(name), int | float)
        and not isinstance(value, bool)
        and value != 1
    }
    softcap = text.get(LOGIT_SOFTCAP_KEY)
    if isinstance(softcap, int | float) and not isinstance(softcap, bool) and softcap:
        found[LOGIT_SOFTCAP_KEY] = float(softcap)
    return found


def logit_processing_problem(recipe: Recipe, hf_config: Mapping[str, Any]) -> Problem | None:
    """The Megatron log-prob path scores the bridge provider's output layer, whose handling
    of a rescale or soft-cap hpcrl has not verified, while the sampler applies it: log-probs
    that differ would skew every ratio and importance weight without a word."""
    processing = logit_processing(hf_config)
    if not processing:
        return None
    named = ", ".join(f"{key} {value:g}" for key, value in processing.items())
    model_type = hf_config.get("model_type")
    if model_type in AUTOMODEL_MODEL_TYPES:
        fix = (
            "train it with the Automodel backend (policy.automodel_cfg.enabled=true, "
            "policy.megatron_cfg.enabled=false), which applies it"
        )
    else:
        fix = (
            f"pick a model without it: the Automodel backend, which applies it, does not "
            f"build model_type {model_type!r} either"
        )
    return Problem(
        path=MODEL,
        value=recipe.policy.model_name,
        message=f"this model post-processes its logits ({named}), which the Megatron "
        "backend does not reproduce in its log-prob path",
        fix=fix,
    )


def quant_method(hf_config: Mapping[str, Any]) -> str | None:
    """``quantization_config.quant_method`` of a quantized checkpoint's config, else None."""
    quantization = hf_config.get("quantization_config")
    if not isinstance(quantization, Mapping):
        return None
    method = quantization.get("quant_method")
    return str(method) if method is not None else None


def _quantized_problem(recipe: Recipe, hf_config: Mapping[str, Any]) -> Problem | None:
    """An MXFP4 checkpoint (gpt-oss's experts) trains only dequantized to bf16 as it loads;
    vLLM would sample from the MXFP4 checkpoint itself, and refitting the trained bf16
    weights into its MXFP4 layers is not tested."""
    if quant_method(hf_config) not in DEQUANTIZED_ON_LOAD:
        return None
    name = recipe.policy.model_name
    if not recipe.policy.dequantize_base_checkpoint:
        return Problem(
            path=DEQUANTIZE, value=False,
            message=f"model {name} stores weights in MXFP4 (quantization_config.quant_method "
            "'mxfp4' in config.json), which hpcrl's Automodel backend cannot train as they "
            "are: it trains unquantized weights, dequantized to bf16 as the model loads",
            fix=f"set {DEQUANTIZE}=true (as NeMo RL's gpt-oss recipes do)",
        )  # fmt: skip
    generation = recipe.policy.generation.backend
    if recipe.algorithm == "grpo" and generation == "vllm":
        return Problem(
            path="policy.generation.backend", value=generation,
            message=f"model {name} is an MXFP4 checkpoint, which vLLM would load quantized: "
            "refitting the policy's dequantized bf16 weights into it is not tested",
            fix=f"train it with SFT, or give {MODEL} a checkpoint saved unquantized (bf16)",
        )  # fmt: skip
    return None


def _packing_problem(recipe: Recipe, hf_config: Mapping[str, Any]) -> Problem | None:
    """A pack would run a recurrent layer's state from one sequence into the next."""
    model_type = hf_config.get("model_type")
    if model_type not in NO_PACKING_MODEL_TYPES or not recipe.policy.sequence_packing.enabled:
        return None
    return Problem(
        path="policy.sequence_packing.enabled", value=True,
        message=f"model {recipe.policy.model_name} is a {model_type} model whose linear-"
        "attention (Gated DeltaNet) layers the automodel backend runs with transformers' torch "
        "path, which carries their state across a pack's sequence boundaries",
        fix="set policy.sequence_packing.enabled=false (policy.dynamic_batching.enabled=true "
        "batches by tokens without packing, as NeMo RL's Qwen3.5 recipes do)",
    )  # fmt: skip


def _fsdp_only_problem(recipe: Recipe, hf_config: Mapping[str, Any]) -> Problem | None:
    """A decoder FSDP alone shards has no tensor-parallel plan (Gemma 3's has:
    ``TP_GEMMA3``), and was tested without context parallelism (NeMo RL itself refuses CP
    for Gemma 3)."""
    model_type = hf_config.get("model_type")
    cfg = recipe.policy.automodel_cfg
    if model_type not in (*FSDP_ONLY_MODEL_TYPES, *MULTIMODAL_TEXT_MODEL_TYPES):
        return None
    split = [(TENSOR_PARALLEL, cfg.tensor_parallel_size, "its tensor-parallel plan is made "
              f"for {', '.join(LLAMA_SHAPED + TP_MOE + TP_GEMMA3)} decoders"),
             (CONTEXT_PARALLEL, cfg.context_parallel_size, "context parallelism is not tested "
              "on these decoders")]  # fmt: skip
    sharded_by = "FSDP alone"
    if model_type in TP_GEMMA3:
        split, sharded_by = split[1:], "FSDP and tensor parallelism"
    if model_type in MULTIMODAL_TEXT_MODEL_TYPES and cfg.lora_cfg.enabled:
        return Problem(
            path="policy.automodel_cfg.lora_cfg.enabled", value=True,
            message=f"model {recipe.policy.model_name} is a multimodal {model_type} wrapper "
            "whose text decoder the automodel backend trains in full: LoRA on it is not tested",
            fix="set policy.automodel_cfg.lora_cfg.enabled=false, or train it with the Megatron "
            "backend (policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false)",
        )  # fmt: skip
    for path, size, why in split:
        if size > 1:
            return Problem(
                path=path, value=size,
                message=f"model {recipe.policy.model_name} is a {model_type} decoder, which "
                f"the automodel backend shards with {sharded_by}: {why}",
                fix=f"set {path}=1, or train it with the Megatron backend "
                "(policy.megatron_cfg.enabled=true, policy.automodel_cfg.enabled=false)",
            )  # fmt: skip
    return None


def _moe_layout_problem(recipe: Recipe, hf_config: Mapping[str, Any]) -> Problem | None:
    """Expert parallelism needs experts (as many as a multiple of the EP size); the MoE
    blocks have no tensor-parallel plan."""
    cfg = recipe.policy.automodel_cfg
    model_type = hf_config.get("model_type")
    count_key = MOE_EXPERT_COUNT_KEYS.get(str(model_type))
    ep = cfg.expert_parallel_size
    experts = _expert_count(hf_config, count_key) if count_key else None
    if count_key is None or experts == 0:
        if ep == 1:
            return None
        return Problem(
            path=EXPERT_PARALLEL, value=ep,
            message=f"model {recipe.policy.model_name} (model_type {model_type!r}) has no "
            "experts the automodel backend can split: its expert parallelism applies to "
            f"{', '.join(MOE_EXPERT_COUNT_KEYS)} models",
            fix=f"set {EXPERT_PARALLEL}=1",
        )  # fmt: skip
    if cfg.tensor_parallel_size > 1:
        return Problem(
            path=TENSOR_PARALLEL, value=cfg.tensor_parallel_size,
            message=f"the automodel backend has no tensor-parallel plan for {model_type} MoE "
            "blocks",
            fix="set policy.automodel_cfg.tensor_parallel_size=1 (split the experts with "
            f"{EXPERT_PARALLEL} instead)",
        )  # fmt: skip
    if isinstance(experts, int) and experts % ep:
        valid = [d for d in range(1, experts + 1) if experts % d == 0]
        return Problem(
            path=EXPERT_PARALLEL, value=ep,
            message=f"does not divide the model's {experts} experts ({count_key} in "
            "config.json): every expert-parallel rank keeps the same number of experts",
            fix=f"set {EXPERT_PARALLEL} to a divisor of {experts} that divides the "
            f"data-parallel size: one of {valid}",
        )  # fmt: skip
    return None


def _expert_count(hf_config: Mapping[str, Any], key: str) -> Any:
    """The config's expert count (a wrapper's: in its ``text_config``); 0 where the key is
    there and null (a dense size of a family with MoE sizes: Gemma 4 31B), None where the
    config does not say (a hub name known without its config.json)."""
    text = hf_config.get("text_config")
    for section in (hf_config, text if isinstance(text, Mapping) else {}):
        if key in section:
            return section[key] or 0
    return None


def read_hf_config(folder: Path) -> dict[str, Any] | None:
    """``folder/config.json`` as a dict; None when it is not there or not readable."""
    try:
        loaded = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None
