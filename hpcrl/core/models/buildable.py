"""The job's side of ``hpcrl.config.architectures``: as it starts, before any worker, the
driver reads the model's ``config.json`` (a local folder, or the hub's file through the
Hugging Face cache) and refuses an architecture the recipe's backend cannot build, with the
message ``validate`` gives when it can see the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcrl.config.architectures import (
    TRANSFORMERS5_MODEL_TYPES,
    architecture_problem,
    builders,
    read_hf_config,
)
from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe


def unbuildable_model(recipe: Recipe, model_path: str) -> Problem | None:
    """The refusal of ``model_path``'s architecture, None when it can be built (or its
    config cannot be fetched: loading the model reports that itself, with the hub's error)."""
    if not builders(recipe):
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
    return architecture_problem(recipe, config) or _transformers_problem(recipe, config)


def _transformers_problem(recipe: Recipe, config: dict[str, Any]) -> Problem | None:
    """A model only transformers >= 5 builds, and this Python's transformers lacks it."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if recipe.backend != "automodel" or model_type not in TRANSFORMERS5_MODEL_TYPES:
        return None
    if model_type in CONFIG_MAPPING_NAMES:
        return None
    return Problem(
        path="policy.model_name", value=recipe.policy.model_name,
        message=f"a {model_type} model, which the automodel backend builds with transformers "
        f">= 5; this job's Python has transformers {transformers.__version__}, which lacks it",
        fix="run the job in a container whose Python has transformers >= 5, or train it "
        "with the Megatron backend (policy.megatron_cfg.enabled=true, "
        "policy.automodel_cfg.enabled=false)",
    )  # fmt: skip
