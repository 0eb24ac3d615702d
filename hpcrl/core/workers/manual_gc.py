"""Manual garbage collection for training workers (``policy.megatron_cfg.manual_gc``).

Python's automatic full collections take ~0.2 s with torch + transformers loaded and land on
different steps on different ranks, so one rank stalls and the others wait in the next
collective. With manual GC, automatic collection is off after setup and every rank runs a
full collection at the same optimizer steps (step counts are identical on all ranks).
Both backends read the same keys, through ``ManualGc.from_recipe``. A worker process has one
owner of it, the hosting ``TrainingWorker`` (``hpcrl.core.workers.actor``), whatever the backend:
backends never switch GC themselves, so no collection (nor the freezes) runs twice.

Without it, automatic GC stays on, but what setup leaves alive (imports, the model, the
optimizer: ~300k objects) is frozen out of later collections all the same: the first GRPO
step allocates heavily (loading compiled graphs, building their guards) and ran ~5 full
collections of that heap, ~0.2-0.3 s each (warm first step on one H100, 2026-12-05).
That first step leaves a heap of its own alive for the run (compiled graphs, their guards,
the engine's captures): it is frozen too, after the process's first optimizer step (step 1,
or the first after a resume), where a full collection of it had cost 0.161 s in step 7 of
an Automodel GRPO run (one H100, 2026-12-07). Periodic collections count the run's steps.
"""

from __future__ import annotations

import gc
import os
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from hpcrl.config.recipe import MegatronCfg, Recipe


def _enable_gc_in_child() -> None:
    gc.enable()


@attrs.define(kw_only=True)
class ManualGc:
    """Switches automatic GC off after setup and collects every ``interval_steps`` steps."""

    enabled: bool
    interval_steps: int
    _fork_hook_registered: bool = attrs.field(default=False, init=False)
    _first_step_frozen: bool = attrs.field(default=False, init=False)

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> ManualGc:
        """Read ``policy.megatron_cfg.manual_gc`` / ``manual_gc_interval`` (both backends)."""
        return cls.from_cfg(recipe.policy.megatron_cfg, "policy.megatron_cfg")

    @classmethod
    def from_cfg(cls, cfg: MegatronCfg, path: str) -> ManualGc:
        """Read ``cfg``'s manual-GC keys; ``path`` names it in errors. A policy process reads
        ``policy.megatron_cfg``; a process that hosts a PPO value model would pass
        ``value.megatron_cfg``. (A distillation teacher may not set these keys: it shares
        its process's one helper.)"""
        interval = cfg.manual_gc_interval if cfg.manual_gc else 0
        if cfg.manual_gc and (
            isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0
        ):
            raise ValueError(
                f"{path}.manual_gc_interval: {interval!r} is not a positive integer; set it "
                "to the number of optimizer steps between full collections, "
                f"e.g. {path}.manual_gc_interval=100"
            )
        return cls(enabled=bool(cfg.manual_gc), interval_steps=int(interval))

    def after_setup(self) -> None:
        """Call at the very end of worker setup (model and optimizer built)."""
        gc.collect()
        # Objects alive now (modules, imports) live for the whole run: keep them out of
        # every later collection, automatic or periodic, so each stays cheap.
        gc.freeze()
        self._first_step_frozen = False
        if not self.enabled:
            return
        gc.disable()
        if not self._fork_hook_registered:
            # Data-loader workers and other forked children run arbitrary code: give them
            # automatic GC back.
            os.register_at_fork(after_in_child=_enable_gc_in_child)
            self._fork_hook_registered = True

    def after_optimizer_step(self, step: int) -> bool:
        """Call after optimizer step ``step`` (1-based, the run's count: past 1 after a
        resume); returns whether it collected."""
        if not self._first_step_frozen:
            # What this process's first step built (compilations) lives on: frozen as well.
            # Not "step == 1": a resumed process never runs step 1. Every rank resumes at
            # the same step, so this collection still lands on the same step everywhere.
            self._first_step_frozen = True
            gc.collect()
            gc.freeze()
            return True
        if not self.enabled or step % self.interval_steps != 0:
            return False
        gc.collect()
        return True

    def restore(self) -> None:
        """Automatic GC back on, nothing frozen (worker teardown)."""
        gc.unfreeze()
        if self.enabled:
            gc.enable()
