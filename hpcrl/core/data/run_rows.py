"""The data rows a run trains and validates on, as the recipe names them: JSONL files
(``data.train_path`` / ``data.val_path``) or NeMo RL's named sets (``hpcrl.core.data.named``),
validation cut to the recipe's limit.

Kept apart from ``hpcrl.core.driver`` so the driver holds only the run's order of events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcrl.config.data_steps import required_keys
from hpcrl.config.recipe import Recipe
from hpcrl.core.data.jsonl import load_jsonl


def training_rows(recipe: Recipe, tokenizer: Any) -> list[dict]:
    """``data.train_path`` (JSONL) or NeMo RL's named set (``hpcrl.core.data.named``)."""
    if recipe.data.train_path is not None:
        return load_jsonl(Path(recipe.data.train_path), required_keys(recipe))
    from hpcrl.core.data.named import load_named_rows

    rows = load_named_rows(recipe, tokenizer, "train")
    assert rows is not None, "the data rules require a training source"
    return rows


def validation_rows(recipe: Recipe, tokenizer: Any) -> list[dict] | None:
    """The validation rows, or None when the run validates never or has nothing to validate
    on (said on stdout, since the run goes on without it)."""
    settings = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert settings is not None
    if settings.val_period <= 0 and not settings.val_at_start and not settings.val_at_end:
        return None
    if recipe.data.train_path is None:
        from hpcrl.core.data.named import load_named_rows

        rows = load_named_rows(recipe, tokenizer, "validation")
        if rows is None:
            print("validation skipped: the data set has no validation part", flush=True)
            return None
        return limit_validation(recipe, rows)
    if recipe.data.val_path is None:
        print(
            f"validation skipped: {recipe.algorithm}.val_period is {settings.val_period} but "
            "data.val_path is not set",
            flush=True,
        )
        return None
    rows = load_jsonl(Path(recipe.data.val_path), required_keys(recipe))
    return limit_validation(recipe, rows)


def limit_validation(recipe: Recipe, rows: list[dict]) -> list[dict]:
    """``grpo.max_val_samples``, or ``sft.val_batches`` x ``sft.val_global_batch_size``."""
    if recipe.grpo is not None and recipe.grpo.max_val_samples is not None:
        return rows[: recipe.grpo.max_val_samples]
    sft = recipe.sft
    if sft is not None and sft.val_batches and sft.val_global_batch_size:
        return rows[: sft.val_batches * sft.val_global_batch_size]
    return rows
