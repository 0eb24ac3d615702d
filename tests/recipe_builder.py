"""The one place tests build recipes (issue 27). Four kinds, each from one function:

- plain dicts, as a user's YAML holds them, changed by dotted keys (``base_dict``,
  ``with_keys``; ``problems_for``: the rule problems of one), for rule, converter and
  data-section tests;
- typed recipes for the planner (``automodel_recipe``, ``megatron_recipe``: a 1.5B model on
  8-GPU nodes, the shipped data file), changed with ``with_policy``;
- typed recipes the training core runs on the tiny models (``tiny_automodel_recipe``,
  ``tiny_megatron_recipe``), changed with ``with_automodel``;
- the shipped recipes under recipes/ as ``hpcrl submit`` resolves them (``shipped_recipe``).

Login-side only at import: hpcrl.config and attrs (spawned Megatron ranks import it too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from hpcrl.config import Problem, structure_recipe
from hpcrl.config.recipe import (
    AutomodelCfg,
    ClusterCfg,
    DataCfg,
    GrpoCfg,
    MegatronCfg,
    MegatronCheckpointCfg,
    MegatronOptimizerCfg,
    MegatronPeftCfg,
    OptimizerCfg,
    PolicyCfg,
    Recipe,
    SftCfg,
)
from hpcrl.config.rules import check_recipe

REPO_ROOT = Path(__file__).resolve().parents[1]
#: An existing data file: the planner checks that data.train_path exists (and lasts: its
#: 256 rows give GRPO's default 100 steps of 8 prompts in GRPO_EPOCHS epochs).
SHIPPED_DATA = str(REPO_ROOT / "recipes" / "data" / "toy_count.jsonl")
GRPO_EPOCHS = 4
#: The batch shape tests/megatron/harness.py's ranks train on (``tiny_megatron_recipe``).
TINY_MEGATRON_SEQ_LEN = 16
TINY_MEGATRON_GLOBAL_BATCH = 8
#: NeMo RL's optimizer section for Transformer Engine's FusedAdam, as its
#: dapo-gemma4-e2b-it-1n8g-fsdp2-automodel.yaml writes it (dtypes as strings).
TE_FUSED_ADAM = {
    "name": "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam",
    "kwargs": {
        "lr": 2.0e-06,
        "weight_decay": 0.1,
        "master_weights": True,
        "store_param_remainders": True,
        "exp_avg_dtype": "torch.bfloat16",
        "exp_avg_sq_dtype": "torch.bfloat16",
    },
}


# --------------------------------------------------------------------------- plain dicts


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


def only(problems: list[Problem], severity: str = "error") -> Problem:
    """The one problem of ``severity`` (fails naming them all when there is not exactly one)."""
    chosen = [problem for problem in problems if problem.severity == severity]
    assert len(chosen) == 1, [problem.format() for problem in problems]
    return chosen[0]


# --------------------------------------------------------------------------- for the planner
def automodel_recipe(num_nodes: int = 1, gpus_per_node: int = 8, **automodel: object) -> Recipe:
    return Recipe(
        policy=PolicyCfg(
            model_name="Qwen/Qwen2-1.5B",
            train_global_batch_size=64,
            automodel_cfg=AutomodelCfg(enabled=True, **automodel),
        ),
        data=DataCfg(train_path=SHIPPED_DATA),
        grpo=GrpoCfg(max_num_epochs=GRPO_EPOCHS),
        cluster=ClusterCfg(num_nodes=num_nodes, gpus_per_node=gpus_per_node),
    )


def megatron_recipe(num_nodes: int = 2, gpus_per_node: int = 8, **megatron: object) -> Recipe:
    return Recipe(
        policy=PolicyCfg(
            model_name="Qwen/Qwen2-1.5B",
            train_global_batch_size=64,
            megatron_cfg=MegatronCfg(enabled=True, **megatron),
        ),
        data=DataCfg(train_path=SHIPPED_DATA),
        grpo=GrpoCfg(max_num_epochs=GRPO_EPOCHS),
        cluster=ClusterCfg(num_nodes=num_nodes, gpus_per_node=gpus_per_node),
    )


def with_policy(recipe: Recipe, **changes: object) -> Recipe:
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, **changes))


# --------------------------------------------------------------------------- tiny, trained
def tiny_automodel_recipe(
    *,
    dp_replicate: int = 1,
    tp: int = 1,
    lr: float = 1e-3,
    micro_batch_size: int = 2,
    manual_gc_interval: int = 0,
    activation_checkpointing: bool = False,
) -> Recipe:
    return Recipe(
        policy=PolicyCfg(
            model_name="tiny:qwen2",
            train_global_batch_size=8,
            train_micro_batch_size=micro_batch_size,
            precision="float32",
            max_grad_norm=1.0,
            optimizer=OptimizerCfg(
                name="torch.optim.AdamW", kwargs={"lr": lr, "weight_decay": 0.01}
            ),
            automodel_cfg=AutomodelCfg(
                enabled=True,
                dp_replicate_size=dp_replicate,
                tensor_parallel_size=tp,
                activation_checkpointing=activation_checkpointing,
            ),
            megatron_cfg=MegatronCfg(
                manual_gc=manual_gc_interval > 0, manual_gc_interval=manual_gc_interval
            ),
        ),
        data=DataCfg(train_path="unused.jsonl"),
        sft=SftCfg(max_num_steps=20),
    )


def with_automodel(recipe: Recipe, **changes: object) -> Recipe:
    automodel = attrs.evolve(recipe.policy.automodel_cfg, **changes)
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, automodel_cfg=automodel))


def tiny_megatron_recipe(
    model_name: str,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    dist_opt: bool = True,
    micro_batch_size: int = 2,
    lr: float = 1e-3,
    manual_gc_interval: int = 0,
    parallel_read_threads: int = 1,
    model_overrides: dict | None = None,
    offload_fraction: float = 0.0,
    precision: str = "float32",
    optimizer_format: str = "dp_reshardable",
    peft: MegatronPeftCfg | None = None,
) -> Recipe:
    """SFT on the Megatron backend of the tiny HF model at ``model_name`` (a path), shaped
    for tests/megatron/harness.py's batches."""
    megatron_cfg = MegatronCfg(
        enabled=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        optimizer=MegatronOptimizerCfg(
            lr=lr,
            use_distributed_optimizer=dist_opt,
            clip_grad=1.0,
            weight_decay=0.01,
            optimizer_cpu_offload=offload_fraction > 0,
            optimizer_offload_fraction=offload_fraction,
        ),
        manual_gc=manual_gc_interval > 0,
        manual_gc_interval=manual_gc_interval,
        checkpoint=MegatronCheckpointCfg(
            parallel_read_threads=parallel_read_threads, optimizer_format=optimizer_format
        ),
        model_overrides=model_overrides or {},
        peft=peft or MegatronPeftCfg(),
    )
    return Recipe(
        policy=PolicyCfg(
            model_name=model_name,
            train_global_batch_size=TINY_MEGATRON_GLOBAL_BATCH,
            train_micro_batch_size=micro_batch_size,
            precision=precision,
            max_total_sequence_length=TINY_MEGATRON_SEQ_LEN,
            megatron_cfg=megatron_cfg,
        ),
        data=DataCfg(train_path="unused.jsonl"),
        sft=SftCfg(max_num_steps=10, seed=7),
    )


# --------------------------------------------------------------------------- shipped
def shipped_recipe(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """recipes/NAME with ``overrides`` (``key=value``), loaded and resolved the way
    ``hpcrl submit`` loads it: the ``LoadedRecipe`` (``.recipe``, ``.resolved_dict``)."""
    from hpcrl.config import load_recipe

    return load_recipe(REPO_ROOT / "recipes" / name, list(overrides))
