"""``checkpointing.metric_name``: NeMo RL's ``val:<name>`` / ``train:<name>`` and the key of
hpcrl's step record (metrics.jsonl) that holds the same value.

NeMo RL names a metric by where it comes from: ``val:`` its validation metrics of that step
(GRPO's ``accuracy``, the mean reward of the validation rollouts, and ``avg_length``; SFT's
``val_loss``), ``train:`` its training metrics (``loss``, ``grad_norm``, ``lr``; GRPO's
``reward``, the mean reward of the step's rollouts, and its loss diagnostics such as
``token_mult_prob_error``). A checkpoint saved at a step without
that metric (no validation ran then) ranks below every one that has it. Any other name
NeMo RL fails on at its first save; hpcrl refuses it when the recipe loads.
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

PATH = "checkpointing.metric_name"

#: (algorithm, prefix) -> NeMo RL's metric name -> hpcrl's step-record key
RECORDED: dict[tuple[str, str], dict[str, str]] = {
    ("grpo", "val"): {"accuracy": "val_reward_mean", "avg_length": "val_avg_length"},
    ("grpo", "train"): {
        "loss": "loss",
        "reward": "reward_mean",
        "grad_norm": "grad_norm",
        "lr": "lr",
        # the loss's diagnostics, recorded under NeMo RL's own names (loss_metrics.py)
        **{
            name: name
            for name in (
                "token_mult_prob_error",
                "gen_kl_error",
                "policy_kl_error",
                "js_divergence_error",
                "approx_entropy",
                "probs_ratio",
                "probs_ratio_clamped",
                "probs_ratio_min",
                "probs_ratio_max",
                "probs_ratio_clamped_min",
                "probs_ratio_clamped_max",
            )
        },
    },
    ("sft", "val"): {"val_loss": "val_loss"},
    ("sft", "train"): {"loss": "loss", "grad_norm": "grad_norm", "lr": "lr"},
}
#: NeMo RL's older unprefixed names (its configs before the val:/train: form)
OLD_NAMES = {"val_reward": "val:accuracy", "val_loss": "val:val_loss", "loss": "train:loss"}


def record_key(algorithm: str, metric_name: str) -> str:
    """The step-record key of a ``metric_name`` that ``rule_checkpoint_metric`` accepts."""
    prefix, name = metric_name.split(":", 1)
    return RECORDED[(algorithm, prefix)][name]


def rule_checkpoint_metric(recipe: Recipe) -> list[Problem]:
    cfg = recipe.checkpointing
    if cfg.metric_name is None or not cfg.enabled:
        return []  # NeMo RL reads it only when it saves
    prefix, _, name = cfg.metric_name.partition(":")
    if prefix not in ("val", "train") or not name:
        new = OLD_NAMES.get(cfg.metric_name, f"val:{cfg.metric_name}")
        return [
            Problem(
                path=PATH,
                value=cfg.metric_name,
                message="NeMo RL's metric names start with val: (a validation metric) or "
                "train: (a training metric); NeMo RL stops at its first save without one",
                fix=f"write {PATH}: {new!r} ({_choices(recipe.algorithm)})",
            )
        ]
    recorded = RECORDED[(recipe.algorithm, prefix)]
    if name not in recorded:
        return [
            Problem(
                path=PATH,
                value=cfg.metric_name,
                message=f"hpcrl's {recipe.algorithm.upper()} records no {prefix} metric "
                f"{name!r}, so no checkpoint could be ranked by it",
                fix=f"use one it records: {_choices(recipe.algorithm)}",
            )
        ]
    if prefix == "val" and cfg.keep_top_k is not None:
        return _validation_schedule_warnings(recipe)
    return []


def _validation_schedule_warnings(recipe: Recipe) -> list[Problem]:
    cfg = recipe.checkpointing
    settings = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert settings is not None
    key = f"{recipe.algorithm}.val_period"
    if settings.val_period <= 0 and settings.val_at_end:
        message = (
            f"{key} is {settings.val_period}: only the last step validates "
            f"({recipe.algorithm}.val_at_end), so the checkpoints before it have no "
            f"{cfg.metric_name} and rank last, as in NeMo RL"
        )
    elif settings.val_period <= 0:
        message = (
            f"{key} is {settings.val_period}: no step validates, so no checkpoint has "
            f"{cfg.metric_name} and keep_top_k keeps the newest, as NeMo RL does"
        )
    elif cfg.save_period % settings.val_period:
        message = (
            f"checkpoints every {cfg.save_period} steps but validation every "
            f"{settings.val_period}: a checkpoint at a step without validation has no "
            f"{cfg.metric_name} and ranks last, as in NeMo RL"
        )
    else:
        return []
    return [
        Problem(
            path=PATH,
            value=cfg.metric_name,
            message=message,
            fix=f"set {key} to a divisor of checkpointing.save_period ({cfg.save_period})",
            severity="warning",
        )
    ]


def _choices(algorithm: str) -> str:
    return ", ".join(
        f"{prefix}:{name}"
        for (owner, prefix), names in RECORDED.items()
        if owner == algorithm
        for name in names
    )


CHECKPOINT_METRIC_RULES = (rule_checkpoint_metric,)
