"""docs/nemo-rl-compat.md is generated from the code and must match it; each row's status
comes from where the value goes (hpcrl.config.consumers), never from the schema alone."""

import importlib

import pytest

from hpcrl.config import consumers, not_consumed
from hpcrl.config.compat import (
    DEFAULT_ONLY,
    IMPLEMENTED,
    INERT,
    OFF_ONLY,
    REJECTED,
    TABLE_FILE,
    UNDECLARED,
    UNKNOWN,
    classify,
    nemo_rl_rows,
    render_table,
)
from hpcrl.config.foreign_key_entry import WILDCARD
from hpcrl.config.foreign_key_table import FOREIGN_KEYS
from hpcrl.config.foreign_keys import schema_paths
from hpcrl.config.nemo_rl_filter import nemo_rl_parts
from hpcrl.config.nemo_rl_keys import registry
from hpcrl.config.recipe import Recipe
from tests.recipe_builder import base_dict, with_keys


def test_the_committed_table_is_what_the_code_says():
    expected = render_table(nemo_rl_rows())
    assert TABLE_FILE.read_text(encoding="utf-8") == expected, (
        "docs/nemo-rl-compat.md is stale: run .venv/bin/python -m hpcrl.config.compat"
    )


def test_no_row_is_undeclared_or_unknown():
    """Every schema field NeMo RL has says where it takes effect or why nowhere; every row
    is a key the loader decides on (none falls through to "unknown key")."""
    bad = [(row.key, row.status) for row in nemo_rl_rows() if row.status in (UNDECLARED, UNKNOWN)]
    assert bad == []


def test_every_nemo_rl_field_of_the_schema_is_declared_once():
    known = registry()
    leaves = [
        path
        for path in schema_paths(Recipe)
        if not any(other.startswith(path + ".") for other in schema_paths(Recipe))
        and not path.startswith(("value.", "teacher."))
    ]
    nemo_rl_fields = [
        path
        for path in leaves
        if (found := known.lookup(nemo_rl_parts(tuple(path.split(".")))))
        and found.path == ".".join(nemo_rl_parts(tuple(path.split("."))))
    ]
    assert len(nemo_rl_fields) > 200
    undeclared = [
        p for p in nemo_rl_fields if p not in consumers.CONSUMED_BY | not_consumed.NOT_CONSUMED
    ]
    twice = sorted(set(consumers.CONSUMED_BY) & set(not_consumed.NOT_CONSUMED))
    declared = set(consumers.CONSUMED_BY) | set(not_consumed.NOT_CONSUMED)
    not_fields = sorted(declared - set(schema_paths(Recipe)))
    assert (undeclared, twice, not_fields) == ([], [], [])


OFF_ONLY_FIELDS = sorted(p for p, e in not_consumed.NOT_CONSUMED.items() if e.status == "off_only")


@pytest.mark.parametrize("path", OFF_ONLY_FIELDS)
def test_an_off_only_field_is_refused_by_its_rule_at_any_other_value(path):
    """The rule an off-only row names refuses a value other than the off one."""
    from hpcrl.config import structure_recipe

    entry = not_consumed.NOT_CONSUMED[path]
    module_name, function_name = entry.rule.split(":")
    rule = getattr(importlib.import_module(module_name), function_name)
    other = {
        "1": 2,
        "false": True,
        "true": False,
        "null": "bfloat16"
        if not path.startswith("env.reward_model.")
        else ("/somewhere" if path.endswith("checkpoint_path") else 1.0),
        "in_order": "windowed",
        "${grpo.num_prompts_per_step}": 1,  # base_dict's is 4
    }[entry.off]
    data = base_dict("automodel" if "automodel_cfg" in path else "megatron")
    if path.startswith("data."):
        # a local ResponseDataset for train and validation; data.default fills both
        local = {"dataset_name": "ResponseDataset", "data_path": __file__}
        data["data"] = {"train": dict(local), "validation": dict(local)}
    if path.startswith("env.reward_model."):
        # read only while the data sets are scored by the reward model
        data["env"] = {"name": "reward_model", "reward_model": {"model_name": "rm"}}
    recipe = structure_recipe(with_keys(data, **{path.replace(".", "__"): other}))
    refused = [p.path for p in rule(recipe) if p.is_error]
    # data.default fills data.train and data.validation: the rule names where it lands
    expected = (
        [path]
        if not path.startswith("data.default.")
        else [
            "data.train.env_name",
            "data.validation.env_name",
        ]
    )
    assert refused == expected


def test_classification_follows_where_the_value_goes():
    assert classify("policy.dtensor_cfg.tensor_parallel_size") == (
        IMPLEMENTED,
        "read as `policy.automodel_cfg.tensor_parallel_size`; read by "
        "`hpcrl.plan.layout:plan_layout`",
    )
    assert classify("policy.dtensor_cfg._v2")[0] == INERT
    assert classify("policy.megatron_cfg.fp8_cfg.enabled")[0] == OFF_ONLY
    assert classify("value.megatron_cfg.manual_gc")[0] == REJECTED
    # parsed but not acted on: no longer "implemented" (issue 24)
    assert classify("grpo.val_batch_size")[0] == INERT
    assert classify("data.num_workers")[0] == INERT
    assert classify("env.math.num_workers")[0] == INERT
    assert classify("policy.megatron_cfg.empty_unused_memory_level")[0] == INERT
    # implemented since the Automodel backend splits rows over CP ranks (issue 24)
    assert classify("policy.dtensor_cfg.context_parallel_size") == (
        IMPLEMENTED,
        "read as `policy.automodel_cfg.context_parallel_size`; read by "
        "`hpcrl.plan.layout:plan_layout`, "
        "`hpcrl.core.backends.automodel.parallelize:parallelize_steps`",
    )
    # implemented since the Automodel TP plan splits the sequence (issue 24)
    assert classify("policy.dtensor_cfg.sequence_parallel") == (
        IMPLEMENTED,
        "read as `policy.automodel_cfg.sequence_parallel`; read by "
        "`hpcrl.core.backends.automodel.parallelize:parallelize_steps`",
    )
    for key in (
        "policy.megatron_cfg.distributed_data_parallel_config.use_custom_fsdp",
        "grpo.max_rollout_turns",
    ):
        assert classify(key)[0] == OFF_ONLY, key
    assert classify("policy.megatron_cfg.context_parallel_size")[0] == IMPLEMENTED
    # a key NeMo RL knows that hpcrl does not use, and its default
    status, note = classify("policy.generation.vllm_cfg.kv_cache_dtype")
    assert status == DEFAULT_ONLY and "'auto'" in note


def test_no_foreign_key_shadows_a_schema_field():
    known = set(schema_paths(Recipe))
    shadowed = [e.path for e in FOREIGN_KEYS if e.path.replace(f".{WILDCARD}", "") in known]
    assert shadowed == [], f"now schema fields, remove them from FOREIGN_KEYS: {shadowed}"
