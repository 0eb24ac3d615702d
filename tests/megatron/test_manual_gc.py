"""Manual GC on the Megatron worker: automatic GC on during setup, off after it, one full
collection every manual_gc_interval optimizer steps, forked children get GC back; which
config each kind of worker reads. (The backend has one training path, ``train_step``; there
is no separate split-step path.)"""

from __future__ import annotations

import pytest

from hpcrl.config.recipe import MegatronCfg
from hpcrl.core.backends.megatron.manual_gc import manual_gc_for
from tests.megatron import harness


@pytest.mark.slow
def test_worker_collects_every_interval_steps(converted):
    hf_path, root = converted
    (result,) = harness.run_ranks(1, harness.manual_gc_run, hf_path, root, 2, 5)
    assert result["before"] is True
    assert result["after_setup"] is False
    # Collections run inside train_step after optimizer step 1 (which then freezes what it
    # built) and steps 2 and 4 (steps_done already incremented), and nowhere else although
    # every step leaves cyclic garbage.
    assert result["collections_at_steps"] == [1, 2, 4]
    assert result["forked_child_gc"] is True
    assert result["after_close"] is True


def test_value_worker_reads_its_own_config_and_teacher_never_collects():
    value_cfg = MegatronCfg(enabled=True, manual_gc=True, manual_gc_interval=7)
    assert (manual_gc_for(value_cfg).enabled, manual_gc_for(value_cfg).interval_steps) == (True, 7)
    assert manual_gc_for(None).enabled is False  # distillation teacher
    assert manual_gc_for(MegatronCfg(enabled=True)).enabled is False


@pytest.mark.parametrize("interval", [0, -3, True, 2.5])
def test_bad_interval_is_refused(interval):
    with pytest.raises(ValueError, match="manual_gc_interval"):
        manual_gc_for(MegatronCfg(enabled=True, manual_gc=True, manual_gc_interval=interval))
