"""Every NeMo RL key the compat table calls "implemented" changes what its consumer sites
build (issue 24, item 5): the key is set to a value other than the base recipe's, and the
probes of its declared sites (``hpcrl.config.consumers.CONSUMED_BY``; what each probe runs:
``consumer_probes``, ``backend_probes``) must give a different result. A key whose sites all
build the same thing either way is not implemented, whatever the schema says.

Each key is tested on the base recipe where it takes effect (Megatron keys on a Megatron
recipe, vLLM keys with vLLM generation, ...); ``CHANGES`` (consumer_changes.py) gives the
value and, where a key only acts together with others (``dynamic_batching.train_mb_tokens``
with ``dynamic_batching.enabled``), the context set on both recipes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hpcrl.config import consumer_sites, consumers
from hpcrl.config.compat import IMPLEMENTED, nemo_rl_rows
from hpcrl.config.converter import unstructure
from hpcrl.config.load_and_check import validate_recipe_dict
from tests.core import backend_probes
from tests.core import consumer_probes as probes
from tests.core.consumer_changes import (
    CHANGES,
    CHAT_TEMPLATE,
    CHECKPOINTS_ELSEWHERE,
    HPCRL_KEYS,
    RM,
    Change,
)

PROBES: dict[str, probes.Probe] = {
    consumer_sites.PLAN: probes.plan_probe,
    consumer_sites.LAYOUT: probes.plan_probe,
    consumer_sites.GEN_PLAN: probes.plan_probe,
    consumer_sites.JOB_ENV: probes.plan_probe,
    "hpcrl.plan.layout:check_batch_sizes": probes.plan_probe,
    "hpcrl.plan.hf_cache:model_names": probes.hf_cache_probe,
    "hpcrl.core.driver:train_recipe": probes.plan_probe,
    consumer_sites.ENGINE: probes.engine_probe,
    consumer_sites.VLLM_ARGS: probes.engine_probe,
    consumer_sites.VLLM_ENV: probes.engine_probe,
    consumer_sites.AM_LOAD: probes.hf_model_probe,
    consumer_sites.AM_DEQUANTIZE: probes.dequantize_probe,
    "hpcrl.core.generation.engine:colocated_engine_spec": probes.plan_probe,
    "hpcrl.core.data.prompts:load_tokenizer": probes.engine_probe,
    consumer_sites.DIST: probes.distribution_probe,
    consumer_sites.BATCHING: probes.batching_probe,
    consumer_sites.GRPO_STEP: probes.grpo_step_probe,
    consumer_sites.SAMPLE: probes.grpo_step_probe,
    consumer_sites.EXPAND: probes.grpo_step_probe,
    consumer_sites.BUDGET: probes.grpo_step_probe,
    consumer_sites.TRAIN_BATCH: probes.grpo_step_probe,
    consumer_sites.FINISH_BATCH: probes.grpo_step_probe,
    consumer_sites.ADVANTAGES: probes.grpo_step_probe,
    consumer_sites.ESTIMATOR_FLAGS: probes.grpo_step_probe,
    consumer_sites.SHAPE_REWARDS: probes.grpo_step_probe,
    consumer_sites.TRAIN: probes.grpo_step_probe,
    consumer_sites.TRUNCATED: probes.grpo_step_probe,
    consumer_sites.STEP_ROLLOUTS: probes.grpo_step_probe,
    consumer_sites.SHAPE: probes.grpo_step_probe,
    consumer_sites.SCALE: probes.grpo_step_probe,
    consumer_sites.LOSS: probes.grpo_step_probe,
    consumer_sites.KL: probes.grpo_step_probe,
    consumer_sites.IS_WEIGHTS: probes.grpo_step_probe,
    consumer_sites.SFT_STEP: probes.sft_step_probe,
    consumer_sites.SFT_BATCH: probes.sft_step_probe,
    consumer_sites.STEPS: probes.steps_probe,
    consumer_sites.SAMPLER: probes.sampler_probe,
    consumer_sites.VAL_ROWS: probes.validation_rows_probe,
    consumer_sites.VAL_SAMPLING: probes.validation_sampling_probe,
    consumer_sites.RUN_STEPS: probes.run_steps_probe,
    consumer_sites.STORE: probes.run_steps_probe,
    consumer_sites.LOGGERS: probes.loggers_probe,
    "hpcrl.core.loggers.wandb:WandbLogger._init": probes.loggers_probe,
    "hpcrl.core.loggers.tensorboard:TensorboardLogger.__init__": probes.loggers_probe,
    "hpcrl.core.loggers.mlflow:MlflowLogger.__init__": probes.loggers_probe,
    "hpcrl.core.loggers.mlflow:tracking_uri": probes.loggers_probe,
    consumer_sites.NAMED: probes.named_data_probe,
    consumer_sites.NAMED_SET: probes.named_data_probe,
    consumer_sites.SPLIT: probes.named_data_probe,
    consumer_sites.DATA_SEED: probes.named_data_probe,
    consumer_sites.CARVE: probes.named_data_probe,
    consumer_sites.CAP: probes.named_data_probe,
    consumer_sites.LOCAL: probes.named_data_probe,
    consumer_sites.FIELDS: probes.named_data_probe,
    consumer_sites.MATH_PROMPT: probes.named_data_probe,
    consumer_sites.SFT_EXAMPLE: probes.named_data_probe,
    consumer_sites.ENV: probes.env_probe,
    consumer_sites.ENV_NAME: probes.plan_probe,
    consumer_sites.NODE_SPLIT: probes.plan_probe,
    consumer_sites.RM_KWARGS: probes.reward_model_probe,
    consumer_sites.AM_OPTIM: backend_probes.automodel_optimizer_probe,
    consumer_sites.AM_SCHED: backend_probes.automodel_optimizer_probe,
    consumer_sites.AM_TRAIN_OPTIM: backend_probes.automodel_training_optimizer_probe,
    consumer_sites.AM_CLIP: backend_probes.clip_probe,
    consumer_sites.AM_PLAN: backend_probes.parallelize_probe,
    consumer_sites.AM_LORA: backend_probes.lora_probe,
    consumer_sites.MG_PROVIDER: backend_probes.megatron_provider_probe,
    consumer_sites.MG_LORA: backend_probes.megatron_lora_probe,
    consumer_sites.MG_OVERRIDES: backend_probes.megatron_provider_probe,
    consumer_sites.MG_CONVERT: backend_probes.conversion_probe,
    consumer_sites.MG_OPTIM: backend_probes.megatron_optimizer_probe,
    consumer_sites.MG_SCHED: backend_probes.megatron_scheduler_probe,
    "hpcrl.core.backends.megatron.offload:precision_aware_optimizer_on": backend_probes.precision_aware_probe,
    consumer_sites.MG_DDP: backend_probes.megatron_ddp_probe,
    "hpcrl.core.driver:_make_step_fn": probes.step_fn_probe,
    "hpcrl.core.algorithms.async_grpo:AsyncGrpoStep.__init__": probes.async_step_probe,
    "hpcrl.core.algorithms.async_grpo_groups:GroupedAsyncGrpoStep.__init__": (
        probes.grouped_step_probe
    ),
}

DATASET_CHANGES: dict[str, Any] = {
    "env_name": "reward_model",
    "dataset_name": "AIME2024",
    "data_path": "other",
    "split": "test",
    "split_validation_size": 0.5,
    "seed": 7,
    "input_key": "alt_in",
    "output_key": "alt_out",
    "prompt_file": "other_prompt",
    "system_prompt_file": "system_prompt",
    "processor": "math_data_processor",
    "repeat": 3,
    "max_samples": 5,
}


def base_recipes(tmp: Path) -> dict[str, dict[str, Any]]:
    data = tmp / "data"
    data.mkdir()
    for name in ("train", "val", "other"):
        rows = [
            {"input": f"{name} {i}+{i}", "output": str(2 * i), "alt_in": f"alt {i}", "alt_out": "x"}
            for i in range(12)
        ]
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    chats = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"{i}"}]}
        for i in range(12)
    ]  # fmt: skip
    (data / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    (data / "prompt.txt").write_text("Solve: {}\n")
    (data / "other_prompt").write_text("Think, then solve: {}\n")
    (data / "system_prompt").write_text("You are careful.\n")
    policy = {
        "model_name": "tiny:qwen2",
        "train_global_batch_size": 16,
        "train_micro_batch_size": 2,
        "max_total_sequence_length": 48,
        "generation": {"max_new_tokens": 6, "stop_token_ids": [], "temperature": 1.0},
        "automodel_cfg": {"enabled": True},
        "megatron_cfg": {"enabled": False},
    }
    grpo = {
        "policy": policy,
        "data": {"train_path": str(data / "train.jsonl")},
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4, "val_period": 2},
        "env": {"name": "math", "math": {"math_verify_impl": "hpcrl_numeric"}},
        "checkpointing": {"enabled": True, "save_period": 2},
        "cluster": {"num_nodes": 1, "gpus_per_node": 8},
    }
    megatron = copy.deepcopy(grpo)
    megatron["policy"]["automodel_cfg"] = {"enabled": False}
    megatron["policy"]["megatron_cfg"] = {"enabled": True}
    megatron["policy"]["optimizer"] = None
    sft = copy.deepcopy(grpo)
    del sft["grpo"], sft["env"]
    sft["sft"] = {"val_period": 2}
    sft["policy"]["tokenizer"] = {"chat_template": CHAT_TEMPLATE}
    sft["data"] = {
        "train": {"dataset_name": "ResponseDataset", "data_path": str(data / "train.jsonl")},
        "validation": {"dataset_name": "ResponseDataset", "data_path": str(data / "val.jsonl")},
    }
    named = copy.deepcopy(grpo)
    named["data"] = {
        "train": {"dataset_name": "ResponseDataset", "data_path": str(data / "train.jsonl")},
        "validation": {"dataset_name": "ResponseDataset", "data_path": str(data / "val.jsonl")},
        "default": {"prompt_file": str(data / "prompt.txt"), "processor": "math_hf_data_processor"},
    }
    flat = copy.deepcopy(grpo)
    flat["data"] = {"dataset_name": "OpenMathInstruct-2", "prompt_file": str(data / "prompt.txt")}
    flat_sft = copy.deepcopy(sft)
    flat_sft["data"] = {"dataset_name": "openmathinstruct2"}
    return {
        "grpo": grpo,
        "megatron": megatron,
        "sft": sft,
        "named": named,
        "flat": flat,
        "flat_sft": flat_sft,
    }


def dataset_change(key: str, data: Path) -> Change:
    section, name = key.rsplit(".", 1)
    value = DATASET_CHANGES[name]
    if name in ("data_path", "prompt_file", "system_prompt_file"):
        value = str(data / value) + (".jsonl" if name == "data_path" else "")
    context: dict[str, Any] = {}
    if name in ("system_prompt_file", "processor"):
        processor = (
            "math_data_processor" if name == "system_prompt_file" else "math_hf_data_processor"
        )
        prompt = str(data / "system_prompt")
        where = "data.default" if section == "data" else section
        context[f"{where}.processor"] = processor
        if name == "processor":
            context[f"{where}.system_prompt_file"] = prompt
    if name == "max_samples":  # read by the SFT sets whose NeMo RL loader reads it
        chats = {"dataset_name": "tulu3_sft_mixture", "data_path": str(data / "chats.jsonl")}
        return Change(value, {"data.train": chats, "data.validation": None}, base="sft")
    if name == "env_name":  # every data set names it (one environment per run)
        context = {"env.reward_model": RM["env.reward_model"]}
        if section == "data":  # the older flat form: one set
            return Change(value, context, base="flat")
        also = {f"data.{which}.env_name": value for which in ("train", "validation")}
        return Change(value, context, base="named", also=also)
    if section == "data":
        if name == "output_key":  # the SFT set whose rows it picks the target of
            return Change(value, {"data.dataset_name": "openmathinstruct2"}, base="flat_sft")
        return Change("DeepScaler" if name == "dataset_name" else value, context, base="flat")
    if section == "data.default" and name in ("dataset_name", "data_path"):
        context.update(DEFAULT_ONLY_SOURCE(data))
    also = {f"{section}.data_path": None} if name == "dataset_name" else {}
    return Change(value, context, base="named", also=also)


def DEFAULT_ONLY_SOURCE(data: Path) -> dict[str, Any]:  # noqa: N802  (a context, like the others)
    """Train and validation naming nothing themselves: data.default's set fills them."""
    return {
        "data.train": {"seed": 3},
        "data.validation": {"seed": 3},
        "data.default.dataset_name": "ResponseDataset",
        "data.default.data_path": str(data / "train.jsonl"),
    }


def base_of(key: str, change: Change) -> str:
    if change.base:
        return change.base
    if key.startswith("policy.megatron_cfg."):
        return "megatron"
    if key.startswith(("sft.", "data.add_")):
        return "sft"
    return "grpo"


def with_keys(data: dict[str, Any], dotted: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for key, value in dotted.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = (
                node.setdefault(part, {})
                if node.get(part) is not None
                else node.setdefault(part, {})
            )
            if node is None:
                raise AssertionError(key)
        node[leaf] = value
    return data


def auto_change(recipe_dict: dict[str, Any], key: str) -> Change:
    """A value other than the base's for a key CHANGES does not list: a flipped bool, a
    doubled (or first) number."""
    recipe, _ = validate_recipe_dict(recipe_dict)
    node: Any = unstructure(recipe)
    for part in key.split("."):
        node = node[part]
    if isinstance(node, bool):
        return Change(not node)
    if isinstance(node, int):
        return Change(node * 2 if node else 2)
    if isinstance(node, float):
        return Change(node * 0.5 if node else 0.5)
    raise AssertionError(f"give {key} (now {node!r}) a value in consumer_changes.CHANGES")


def implemented_keys() -> list[str]:
    """The schema paths of the compat table's implemented rows."""
    from hpcrl.config.aliases import rename_path

    keys = {
        ".".join(rename_path(tuple(row.key.split("."))))
        for row in nemo_rl_rows()
        if row.status == IMPLEMENTED
    }
    return sorted(keys)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> tuple[dict[str, dict[str, Any]], Path]:
    tmp = tmp_path_factory.mktemp("bases")
    return base_recipes(tmp), tmp / "data"


@pytest.fixture(scope="module")
def earlier_results() -> dict[tuple[str, str], Any]:
    """Probe results of base recipes, shared by the keys tested on the same base."""
    return {}


@pytest.mark.parametrize("key", sorted(HPCRL_KEYS))
def test_an_hpcrl_key_changes_what_its_sites_build(key, bases, earlier_results, tmp_path):
    """The same check for hpcrl's own keys (``optimizer_offload_fraction``: the JobSpec's
    recipe reaches the worker's optimizer construction, which offloads a share)."""
    test_an_implemented_key_changes_what_its_sites_build(key, bases, earlier_results, tmp_path)


@pytest.mark.parametrize("key", implemented_keys())
def test_an_implemented_key_changes_what_its_sites_build(key, bases, earlier_results, tmp_path):
    recipes, data = bases
    if key.startswith(("data.train.", "data.validation.", "data.default.")) or (
        key.startswith("data.") and key.count(".") == 1 and key.split(".")[1] in DATASET_CHANGES
    ):
        change = dataset_change(key, data)
    else:
        change = (
            CHANGES.get(key)
            or HPCRL_KEYS.get(key)
            or auto_change(recipes[base_of(key, Change(None))], key)
        )
    base = with_keys(recipes[base_of(key, change)], change.context)
    value = change.value
    if value == CHECKPOINTS_ELSEWHERE:
        value = str(tmp_path / "elsewhere")
    changed = with_keys(base, {**change.also, key: value})
    before, _ = validate_recipe_dict(base)
    after, _ = validate_recipe_dict(changed)
    sites = consumers.CONSUMED_BY.get(key) or consumers.CONSUMED_BY[free_form_field(key)]
    chosen = {PROBES[site] for site in sites if site in PROBES}
    assert chosen, f"no probe for any site of {key}: {sites}"
    results = []
    for index, probe in enumerate(sorted(chosen, key=lambda p: p.__name__)):
        cache_key = (probe.__name__, json.dumps(base, sort_keys=True))
        if cache_key not in earlier_results:
            earlier_results[cache_key] = probe(before, _fresh(tmp_path, f"{index}-before"))
        old = earlier_results[cache_key]
        new = probe(after, _fresh(tmp_path, f"{index}-after"))
        results.append((probe.__name__, old != new))
    assert any(differs for _, differs in results), (
        f"{key}={value!r}: nothing its sites build changed ({results})"
    )


def free_form_field(key: str) -> str:
    from hpcrl.config.compat import FREE_FORM

    return next(field for field in FREE_FORM if key.startswith(field + "."))


def _fresh(tmp: Path, name: str) -> Path:
    folder = tmp / name
    folder.mkdir()
    return folder


def test_every_declared_site_exists():
    """A site renamed or removed leaves its keys' rows pointing nowhere: rename it here too."""
    import importlib

    sites = {site for group in consumers.CONSUMED_BY.values() for site in group}
    missing = []
    for site in sorted(sites):
        module_name, qualname = site.split(":")
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part, None)
        if not callable(target):
            missing.append(site)
    assert missing == []
