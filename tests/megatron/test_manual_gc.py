"""Manual GC on a Megatron rank (the TrainingWorker hosting the Megatron backend): automatic
GC on during setup, off after it, one full collection every manual_gc_interval optimizer
steps, forked children get GC back; which config a value model's process would read. (The
backend has one training path, ``train_step``; there is no separate split-step path.)"""

from __future__ import annotations

import pytest

from hpcrl.config.recipe import MegatronCfg
from hpcrl.core.workers.manual_gc import ManualGc
from tests.megatron import harness


@pytest.mark.slow
def test_worker_collects_every_interval_steps(converted):
    hf_path, root = converted
    (result,) = harness.run_ranks(
        1, harness.manual_gc_run, hf_path, root, 2, 5, process_group=False
    )
    assert result["before"] is True
    assert result["after_setup"] is False
    # One full collection after optimizer step 1 (which then freezes what it built) and
    # after steps 2 and 4, and nowhere else although every step leaves cyclic garbage. Once
    # each: the process has one owner of manual GC (the TrainingWorker); a second one (the
    # backend's own) would collect twice per due step.
    assert result["collections_at_steps"] == [1, 2, 4]
    assert result["forked_child_gc"] is True
    assert result["after_close"] is True


def test_value_model_config_is_read_as_given():
    value_cfg = MegatronCfg(enabled=True, manual_gc=True, manual_gc_interval=7)
    helper = ManualGc.from_cfg(value_cfg, "value.megatron_cfg")
    assert (helper.enabled, helper.interval_steps) == (True, 7)
    assert ManualGc.from_cfg(MegatronCfg(enabled=True), "value.megatron_cfg").enabled is False


@pytest.mark.parametrize("interval", [0, -3, True, 2.5])
def test_bad_interval_is_refused(interval):
    cfg = MegatronCfg(enabled=True, manual_gc=True, manual_gc_interval=interval)
    with pytest.raises(ValueError, match=r"value\.megatron_cfg\.manual_gc_interval: "):
        ManualGc.from_cfg(cfg, "value.megatron_cfg")
