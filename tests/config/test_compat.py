"""docs/nemo-rl-compat.md is generated from the code and must match it."""

from hpcrl.config.compat import (
    IMPLEMENTED,
    INERT,
    OFF_ONLY,
    REJECTED,
    TABLE_FILE,
    classify,
    read_keys,
    render_table,
)
from hpcrl.config.foreign_keys import FOREIGN_KEYS, WILDCARD, schema_paths
from hpcrl.config.recipe import Recipe


def test_the_committed_table_is_what_the_code_says():
    expected = render_table(read_keys())
    assert TABLE_FILE.read_text(encoding="utf-8") == expected, (
        "docs/nemo-rl-compat.md is stale: run .venv/bin/python -m hpcrl.config.compat"
    )


def test_no_foreign_key_shadows_a_schema_field():
    known = set(schema_paths(Recipe))
    shadowed = [e.path for e in FOREIGN_KEYS if e.path.replace(f".{WILDCARD}", "") in known]
    assert shadowed == [], f"now schema fields, remove them from FOREIGN_KEYS: {shadowed}"


def test_classification_follows_the_loader():
    known = set(schema_paths(Recipe))
    assert classify("policy.dtensor_cfg.tensor_parallel_size", known) == (
        IMPLEMENTED,
        "read as `policy.automodel_cfg.tensor_parallel_size`",
    )
    assert classify("policy.dtensor_cfg._v2", known)[0] == INERT
    assert classify("policy.megatron_cfg.fp8_cfg.enabled", known)[0] == OFF_ONLY
    assert classify("value.megatron_cfg.manual_gc", known)[0] == REJECTED
    assert classify("logger.wandb.project", known)[0] == IMPLEMENTED
