"""The job's side of ``hpcrl.config.architectures``: as it starts, before any worker, the
driver reads the model's ``config.json`` (a local folder, or the hub's file through the
Hugging Face cache) and refuses an architecture the recipe's backend cannot build, with the
message ``validate`` gives when it can see the file."""

from __future__ import annotations

from pathlib import Path

from hpcrl.config.architectures import architecture_problem, builders, read_hf_config
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
    return None if config is None else architecture_problem(recipe, config)
