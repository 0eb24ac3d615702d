"""Small valid recipes as plain dicts, changed by dotted keys, for rule and converter tests."""

from typing import Any

from hpcrl.config import Problem, structure_recipe
from hpcrl.config.rules import check_recipe


def base_dict(backend: str = "megatron", algorithm: str = "grpo") -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "policy": {
            "model_name": "tiny:qwen2",
            "train_global_batch_size": 8,
            "train_micro_batch_size": 2,
            "automodel_cfg": {"enabled": backend == "automodel"},
            "megatron_cfg": {"enabled": backend == "megatron"},
        },
        "data": {"train_path": "/data/train.jsonl"},
        algorithm: {"num_prompts_per_step": 4, "num_generations_per_prompt": 2}
        if algorithm == "grpo"
        else {},
    }
    return recipe


def with_keys(data: dict[str, Any], **dotted: Any) -> dict[str, Any]:
    """Set ``a__b__c=value`` (``__`` stands for the dot) in a copy of ``data``."""
    import copy

    data = copy.deepcopy(data)
    for key, value in dotted.items():
        node = data
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return data


def problems_for(
    backend: str = "megatron", algorithm: str = "grpo", **dotted: Any
) -> list[Problem]:
    """Rule problems of the base recipe with ``dotted`` keys changed."""
    return check_recipe(structure_recipe(with_keys(base_dict(backend, algorithm), **dotted)))


def paths(problems: list[Problem], severity: str = "error") -> list[str]:
    return [problem.path for problem in problems if problem.severity == severity]
