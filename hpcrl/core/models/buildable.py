"""The job's side of ``hpcrl.config.architectures``: as it starts, before any worker, the
driver reads the model's ``config.json`` (a local folder, or the hub's file through the
Hugging Face cache) and refuses an architecture the recipe's backend cannot build, with the
message ``validate`` gives when it can see the file."""

from __future__ import annotations

from pathlib import Path

from hpcrl.config.architectures import (
    MODEL,
    TRANSFORMERS_5_MODEL_TYPES,
    architecture_problem,
    config_checked,
    logit_processing_problem,
    read_hf_config,
)
from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe


def unbuildable_model(recipe: Recipe, model_path: str) -> Problem | None:
    """The refusal of ``model_path``'s architecture, None when it can be built (or its
    config cannot be fetched: loading the model reports that itself, with the hub's error)."""
    if not config_checked(recipe):
        return None
    folder = Path(model_path)
    if not folder.is_dir():
        from huggingface_hub import hf_hub_download

        try:
            folder = Path(hf_hub_download(model_path, "config.json")).parent
        except Exception:  # noqa: BLE001 -- any hub failure: the model load names it
            return None
    config = read_hf_config(folder)
    if config is None:
        return None
    return (
        architecture_problem(recipe, config)
        or transformers_lacks(recipe, config)
        or logits_processed_by_default(recipe, folder)
    )


def logits_processed_by_default(recipe: Recipe, folder: Path) -> Problem | None:
    """The Megatron backend's refusal of logit processing that config.json leaves to
    transformers' defaults (a Gemma 2 config without ``final_logit_softcapping`` soft-caps
    at 30): the job reads the config as the sampler's model will, which validate cannot."""
    if recipe.backend != "megatron":
        return None
    from transformers import AutoConfig

    try:
        loaded = AutoConfig.from_pretrained(folder)
    except Exception:  # noqa: BLE001 -- a type this transformers lacks: the bridge names it
        return None
    return logit_processing_problem(recipe, loaded.to_dict())


def transformers_lacks(recipe: Recipe, hf_config: dict) -> Problem | None:
    """The refusal of a model type this job's transformers does not know (the Automodel
    backend builds it with transformers' own classes), None when it knows it."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = hf_config.get("model_type")
    if recipe.backend != "automodel" or model_type in CONFIG_MAPPING_NAMES:
        return None
    needs = "5" if model_type in TRANSFORMERS_5_MODEL_TYPES else "a newer release"
    return Problem(
        path=MODEL,
        value=recipe.policy.model_name,
        message=f"a {model_type!r} model, which transformers {transformers.__version__} in "
        f"the job's Python cannot build (its classes came with transformers {needs})",
        fix=f"give the profile a container image with transformers {needs} or newer "
        "(NeMo RL's containers ship transformers 5)",
    )
