"""``checkpointing.save_consolidated`` (NeMo RL's key) is a schema field now: on with
checkpointing it loads; on without checkpointing it is an error naming both keys and the fix."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError, load_recipe
from hpcrl.config.compat import IMPLEMENTED, classify
from hpcrl.config.foreign_keys import find_foreign_key

RECIPE = "grpo-tiny-1n-cpu"


def test_on_with_checkpointing_loads():
    overrides = ["checkpointing.enabled=true", "checkpointing.save_consolidated=true"]
    cfg = load_recipe(RECIPE, overrides).recipe.checkpointing
    assert (cfg.enabled, cfg.save_consolidated) == (True, True)
    assert load_recipe(RECIPE).recipe.checkpointing.save_consolidated is False


def test_on_without_checkpointing_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as caught:
        load_recipe(RECIPE, ["checkpointing.enabled=false", "checkpointing.save_consolidated=true"])
    (problem,) = [p for p in caught.value.errors if p.path == "checkpointing.save_consolidated"]
    assert "checkpointing.enabled is false: nothing is saved" in problem.message
    assert problem.fix.startswith("set checkpointing.enabled=true")
    assert "hpcrl export RUN" in problem.fix


def test_it_is_no_longer_a_foreign_key():
    assert find_foreign_key(("checkpointing", "save_consolidated")) is None
    status, why = classify("checkpointing.save_consolidated")
    assert (status, why) == (IMPLEMENTED, "read by `hpcrl.core.driver:checkpoint_store`")
