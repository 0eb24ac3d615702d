"""Manual GC: every rank collects at optimizer steps N, 2N, ... and nowhere else; automatic
GC is off on the workers but back on in forked children."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest

from tests.core.parallel_harness import make_batch, masked_nll_loss, start_policy
from tests.recipe_builder import tiny_automodel_recipe

pytestmark = pytest.mark.slow


def install_gc_recorder(backend: object) -> bool:
    """Record (optimizer step, generation) of every collection on this rank from now on."""
    log: list[tuple[int, int]] = []
    backend.gc_log = log

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            log.append((backend.step, info["generation"]))

    gc.callbacks.append(record)
    return gc.isenabled()


def recorded_collections(backend: object) -> list[tuple[int, int]]:
    return list(backend.gc_log)


def gc_enabled_in_forked_child(backend: object) -> bool:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, b"1" if gc.isenabled() else b"0")
        os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 1)
    os.close(read_end)
    os.waitpid(pid, 0)
    return answer == b"1"


def test_collections_on_every_rank_at_the_same_steps(ray_cluster, tiny_model_path):
    recipe = tiny_automodel_recipe(manual_gc_interval=3)
    policy = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        enabled_after_setup = policy.group.call_same("run", install_gc_recorder)
        for seed in range(7):
            policy.train(make_batch(seed, batch_size=4), masked_nll_loss)
        collections = policy.group.call_same("run", recorded_collections)
        child_gc = policy.group.call_same("run", gc_enabled_in_forked_child)
    finally:
        policy.shutdown()

    assert enabled_after_setup == [False, False]
    # Full (generation 2) collections after step 1 (then what it built is frozen) and steps
    # 3 and 6 only; no automatic ones at all.
    assert collections == [[(1, 2), (3, 2), (6, 2)], [(1, 2), (3, 2), (6, 2)]]
    assert child_gc == [True, True]


def test_manual_gc_off_leaves_automatic_gc_on_with_setups_objects_frozen():
    """In a fresh interpreter (the test process's GC must not be touched)."""
    script = textwrap.dedent(
        """
        import gc
        from hpcrl.core.workers.manual_gc import ManualGc
        import torch  # a heap like a worker's (setup's imports and objects)
        assert len(gc.get_objects()) > 100_000
        off = ManualGc(enabled=False, interval_steps=0)
        off.after_setup()
        assert gc.isenabled() and gc.get_freeze_count() > 100_000
        frozen_at_setup = gc.get_freeze_count()
        first_step_built = [{"graph": [index]} for index in range(20_000)]
        collected = [step for step in range(1, 10) if off.after_optimizer_step(step)]
        assert collected == [1], collected  # then automatic collections only
        assert gc.get_freeze_count() >= frozen_at_setup + 40_000, gc.get_freeze_count()
        # What an automatic full collection walks from now on: not setup's heap.
        assert len(gc.get_objects()) < 10_000, len(gc.get_objects())
        off.restore()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        on = ManualGc(enabled=True, interval_steps=4)
        on.after_setup()
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        assert [s for s in range(1, 13) if on.after_optimizer_step(s)] == [1, 4, 8, 12]
        on.restore()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_resumed_process_freezes_after_its_own_first_step():
    """A process that resumes at step 5 (a load) never runs step 1: what its first step
    builds is frozen after step 5, while collections stay on the run's step numbers (every
    rank resumes at the same step, so they still agree). A fresh interpreter again."""
    script = textwrap.dedent(
        """
        import gc
        from hpcrl.core.workers.manual_gc import ManualGc
        on = ManualGc(enabled=True, interval_steps=2)
        on.after_setup()
        frozen_at_setup = gc.get_freeze_count()
        first_step_built = [{"graph": [index]} for index in range(20_000)]
        assert on.after_optimizer_step(5)
        assert gc.get_freeze_count() >= frozen_at_setup + 40_000, gc.get_freeze_count()
        assert [s for s in range(6, 11) if on.after_optimizer_step(s)] == [6, 8, 10]
        on.restore()
        # A worker set up again in this process (a rank that loads after training) freezes
        # after its first step once more.
        on.after_setup()
        assert [s for s in range(3, 6) if on.after_optimizer_step(s)] == [3, 4]
        on.restore()
        off = ManualGc(enabled=False, interval_steps=0)
        off.after_setup()
        assert [s for s in range(7, 12) if off.after_optimizer_step(s)] == [7]
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_manual_gc_interval_must_be_positive():
    import attrs

    from hpcrl.core.workers.manual_gc import ManualGc

    recipe = tiny_automodel_recipe()
    bad = attrs.evolve(recipe.policy.megatron_cfg, manual_gc=True, manual_gc_interval=0)
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, megatron_cfg=bad))
    with pytest.raises(ValueError, match=r"policy\.megatron_cfg\.manual_gc_interval: 0"):
        ManualGc.from_recipe(recipe)
