"""Which manual-GC settings a Megatron worker uses (the mechanism is ``hpcrl.core.workers.manual_gc``).

A policy worker reads ``policy.megatron_cfg``; a PPO value worker passes ``value.megatron_cfg``;
a distillation teacher never runs manual GC (its ``megatron_cfg_overrides`` may not set it:
the config rules reject that), so it gets the disabled helper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrl.config.recipe import MegatronCfg
    from hpcrl.core.workers.manual_gc import ManualGc


def manual_gc_for(cfg: MegatronCfg | None) -> ManualGc:
    """The helper for a worker built from ``cfg`` (None: a teacher, never manual GC)."""
    from hpcrl.core.workers.manual_gc import ManualGc

    if cfg is None or not cfg.manual_gc:
        return ManualGc(enabled=False, interval_steps=0)
    interval = cfg.manual_gc_interval
    if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
        raise ValueError(
            f"megatron_cfg.manual_gc_interval: {interval!r} is not a positive integer; set the "
            "number of optimizer steps between full collections, e.g. manual_gc_interval=100"
        )
    return ManualGc(enabled=True, interval_steps=interval)
