"""Key by key: what hpcrl resolves from NeMo RL's own configs equals what NeMo RL's own
loader resolves (``nemo_rl/utils/config.py`` of the snapshot: load_config with ``defaults:``
inheritance, its resolvers, OmegaConf interpolation), for model, batch sizes, learning rate
and schedule, TP/PP, packing, offload, sequence lengths, KL, generations per prompt,
checkpointing, loggers and the node split, on five configs of NeMo RL's main branch.

hpcrl's values are read from the validated recipe (every field with the value it takes,
defaults included: ``LoadedRecipe.effective_dict``); NeMo RL's ``dtensor_cfg`` is hpcrl's
``automodel_cfg``. The node split and the parallel layout are compared with what NeMo RL's
GRPO/SFT setup computes from the same config (written here from its code), against hpcrl's
plan on the shipped ``eos`` profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcrl.config import load_profile
from hpcrl.config.node_split import node_split
from hpcrl.plan.planner import plan
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl, nemo_rl_resolved, release_root
from tests.plan.planning_inputs import isolate_from_user_profiles

CONFIGS = [
    "grpo_math_1B.yaml",
    "grpo_math_1B_megatron.yaml",
    "sft.yaml",
    # non-colocated vLLM on 2 nodes, dynamic batching, a 3-entry scheduler list
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated.yaml",
    # Megatron TP 2 × PP 2, sequence packing, OpenMathInstruct-2 SFT
    "recipes/llm/sft-llama3.1-8b-1n8g-megatron-seqpack.yaml",
]

POLICY = [
    "policy.model_name",
    "policy.tokenizer.name",
    "policy.tokenizer.chat_template",
    "policy.train_global_batch_size",
    "policy.train_micro_batch_size",
    "policy.max_total_sequence_length",
    "policy.precision",
    "policy.max_grad_norm",
    "policy.make_sequence_length_divisible_by",
    "policy.sequence_packing.enabled",
    "policy.sequence_packing.train_mb_tokens",
    "policy.sequence_packing.algorithm",
    "policy.sequence_packing.sequence_length_round",
    "policy.dynamic_batching.enabled",
    "policy.dynamic_batching.train_mb_tokens",
    "policy.dynamic_batching.sequence_length_round",
]
AUTOMODEL = [
    "policy.dtensor_cfg.tensor_parallel_size",
    "policy.dtensor_cfg.context_parallel_size",
    "policy.dtensor_cfg.sequence_parallel",
    "policy.dtensor_cfg.activation_checkpointing",
    "policy.dtensor_cfg.cpu_offload",
    "policy.optimizer.name",
    "policy.optimizer.kwargs.lr",
    "policy.optimizer.kwargs.weight_decay",
    "policy.optimizer.kwargs.betas",
    "policy.optimizer.kwargs.eps",
]
MEGATRON = [
    f"policy.megatron_cfg.{key}"
    for key in (
        "enabled",
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "sequence_parallel",
        "activation_checkpointing",
        "optimizer.lr",
        "optimizer.min_lr",
        "optimizer.weight_decay",
        "optimizer.clip_grad",
        "optimizer.optimizer_cpu_offload",
        "optimizer.optimizer_offload_fraction",
        "scheduler.lr_warmup_iters",
        "scheduler.lr_warmup_init",
        "scheduler.lr_decay_style",
        "scheduler.lr_decay_iters",
        "scheduler.start_weight_decay",
        "scheduler.end_weight_decay",
    )
]
GRPO = [
    *(
        f"grpo.{key}"
        for key in (
            "num_prompts_per_step",
            "num_generations_per_prompt",
            "max_num_steps",
            "max_num_epochs",
            "normalize_rewards",
            "use_leave_one_out_baseline",
            "overlong_filtering",
            "use_dynamic_sampling",
            "batch_multiplier",
            "val_period",
            "val_at_start",
            "max_val_samples",
            "seed",
        )
    ),
    *(
        f"loss_fn.{key}"
        for key in (
            "reference_policy_kl_penalty",
            "reference_policy_kl_type",
            "kl_input_clamp_value",
            "kl_output_clamp_value",
            "ratio_clip_min",
            "ratio_clip_max",
            "ratio_clip_c",
            "use_on_policy_kl_approximation",
            "use_importance_sampling_correction",
            "token_level_loss",
        )
    ),
    "policy.logprob_batch_size",
    "policy.sequence_packing.logprob_mb_tokens",
    "policy.dynamic_batching.logprob_mb_tokens",
    *(
        f"policy.generation.{key}"
        for key in (
            "backend",
            "max_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "vllm_cfg.precision",
            "vllm_cfg.tensor_parallel_size",
            "vllm_cfg.pipeline_parallel_size",
            "vllm_cfg.gpu_memory_utilization",
            "vllm_cfg.max_model_len",
            "vllm_cfg.enforce_eager",
            "colocated.enabled",
            "colocated.resources.num_nodes",
            "colocated.resources.gpus_per_node",
        )
    ),
]
SFT = [
    f"sft.{key}"
    for key in (
        "max_num_steps",
        "max_num_epochs",
        "val_period",
        "val_at_start",
        "val_batches",
        "val_global_batch_size",
        "seed",
    )
]
DATA = [
    "data.max_input_seq_length",
    "data.shuffle",
    "data.add_generation_prompt",
    *(
        f"data.{section}.{key}"
        for section in ("train", "validation")
        for key in ("dataset_name", "split", "output_key", "split_validation_size", "seed")
    ),
]
CHECKPOINTING = [
    f"checkpointing.{key}"
    for key in (
        "enabled",
        "checkpoint_dir",
        "save_period",
        "keep_top_k",
        "metric_name",
        "higher_is_better",
    )
]
LOGGERS = [
    f"logger.{key}"
    for key in (
        "log_dir",
        "wandb_enabled",
        "tensorboard_enabled",
        "mlflow_enabled",
        "monitor_gpus",
        "wandb.project",
        "wandb.name",
        "tensorboard.log_dir",
        "mlflow.experiment_name",
        "mlflow.run_name",
        "mlflow.tracking_uri",
        "gpu_monitoring.collection_interval",
        "gpu_monitoring.flush_interval",
    )
]
CLUSTER = ["cluster.num_nodes", "cluster.gpus_per_node"]
#: NeMo RL's section names → hpcrl's
RENAMED = {"dtensor_cfg": "automodel_cfg"}
MISSING = object()


def keys_of(nemo: dict[str, Any]) -> list[str]:
    megatron = nemo["policy"].get("megatron_cfg", {}).get("enabled", False)
    algorithm = GRPO if "grpo" in nemo else SFT
    backend = MEGATRON if megatron else AUTOMODEL
    return [*POLICY, *backend, *algorithm, *DATA, *CHECKPOINTING, *LOGGERS, *CLUSTER]


def lookup(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return MISSING
        tree = tree[part]
    return tree


def plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def hpcrl_path(dotted: str) -> str:
    return ".".join(RENAMED.get(part, part) for part in dotted.split("."))


@pytest.fixture
def eos(monkeypatch, tmp_path):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    return load_profile("eos")


@pytest.mark.parametrize("relative", CONFIGS)
def test_resolved_values_match_nemo_rl_key_by_key(relative):
    path = config_path(relative)
    nemo = nemo_rl_resolved(path)
    hpcrl = load_as_hpcrl(path).effective_dict()
    compared, differing = 0, []
    for key in keys_of(nemo):
        want = lookup(nemo, key)
        if want is MISSING:
            continue  # this config leaves it to NeMo RL's code default: not a config value
        got = lookup(hpcrl, hpcrl_path(key))
        compared += 1
        if got is MISSING or plain(got) != plain(want):
            differing.append(f"{key}: NeMo RL {want!r}, hpcrl {got!r}")
    assert differing == []
    assert compared >= 60, compared


@pytest.mark.parametrize("relative", CONFIGS)
def test_scheduler_and_data_files_match_nemo_rl(relative):
    path = config_path(relative)
    nemo = nemo_rl_resolved(path)
    loaded = load_as_hpcrl(path)
    hpcrl = loaded.effective_dict()
    # The scheduler list, entry by entry (hpcrl's entries also hold the keys left unset).
    schedulers = nemo["policy"].get("scheduler")
    got = hpcrl["policy"]["scheduler"]
    if schedulers is None:
        assert not got
    else:
        assert [{key: plain(entry[key]) for key in want} for entry, want in zip(got, schedulers, strict=True)] == schedulers  # fmt: skip
    # Prompt files: NeMo RL's path relative to its checkout, hpcrl's absolute in the snapshot.
    for section in ("train", "validation", "default"):
        for key in ("prompt_file", "system_prompt_file"):
            want = lookup(nemo, f"data.{section}.{key}")
            got = lookup(hpcrl, f"data.{section}.{key}")
            if want in (MISSING, None):
                assert got in (MISSING, None), (section, key, got)
            else:
                assert got == str(release_root() / want) and Path(got).is_file(), got


def nemo_rl_split(nemo: dict[str, Any]) -> tuple[int, int, int, int]:
    """(training nodes, training GPUs per node, generation nodes, generation GPUs per node)
    as NeMo RL's setup computes them (nemo_rl/algorithms/grpo.py setup(); sft.py gives the
    whole cluster to training); no reward-model or teacher nodes in these configs."""
    total, per_node = nemo["cluster"]["num_nodes"], nemo["cluster"]["gpus_per_node"]
    generation = nemo["policy"].get("generation") or {}
    if "grpo" not in nemo or generation["colocated"]["enabled"]:
        return total, per_node, 0, 0
    resources = generation["colocated"]["resources"]
    if total == 1:
        return 1, per_node - resources["gpus_per_node"], 1, resources["gpus_per_node"]
    return total - resources["num_nodes"], per_node, resources["num_nodes"], per_node


@pytest.mark.parametrize("relative", CONFIGS)
def test_node_split_and_layout_match_nemo_rl(relative, eos):
    path = config_path(relative)
    nemo = nemo_rl_resolved(path)
    recipe = load_as_hpcrl(path).recipe
    split = node_split(recipe)
    training_nodes, training_gpus, generation_nodes, generation_gpus = nemo_rl_split(nemo)
    assert (
        split.training_nodes,
        split.training_gpus_per_node,
        split.generation_nodes,
        split.generation_gpus_per_node,
    ) == (training_nodes, training_gpus, generation_nodes, generation_gpus)
    spec = plan(recipe, eos, run_dir="/runs/nemo-rl", recipe_source=str(path))
    assert spec.num_nodes == nemo["cluster"]["num_nodes"]  # nothing added on top
    world = training_nodes * training_gpus
    assert spec.world_size == world
    policy = nemo["policy"]
    if policy.get("megatron_cfg", {}).get("enabled"):
        megatron = policy["megatron_cfg"]
        tp, pp = megatron["tensor_model_parallel_size"], megatron["pipeline_model_parallel_size"]
        cp = megatron["context_parallel_size"]
    else:
        dtensor = policy["dtensor_cfg"]
        tp, pp, cp = dtensor["tensor_parallel_size"], 1, dtensor["context_parallel_size"]
    assert (spec.layout.tp, spec.layout.pp, spec.layout.cp) == (tp, pp, cp)
    assert spec.layout.dp == world // (tp * pp * cp)
