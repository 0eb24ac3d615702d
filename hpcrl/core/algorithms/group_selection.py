"""Which finished prompt groups a training step takes (NeMo RL's staleness samplers,
``nemo_rl/algorithms/async_utils/staleness_sampler.py``), over hpcrl's buffer of groups
dispatched one prompt at a time (``hpcrl.core.algorithms.async_grpo_groups``).

Every group records its dispatch order and the trainer version (optimizer steps taken so far)
whose weights it started sampling with; ``ready`` once its generation finished.

- ``windowed``: dispatch is never gated on the trainer version (only on the buffer's and the
  in-flight room); a step at version v takes ready groups that started on v-W..v, earliest
  dispatched first; ready groups older than that are evicted untrained.
- ``ready_first``: dispatch admits the k-th batch of ``num_prompts_per_step`` prompts (from 0)
  only once the trainer version is at least k - W; a step takes any ready group that started
  on a version <= v, earliest dispatched first; nothing is ever evicted.

A selection takes every eligible group up to ``max_groups`` at once, never waits to fill it,
and takes none while fewer than ``min_groups`` are eligible (``min_groups_for_streaming_train``).
No torch here: pure bookkeeping, tested against a reference of NeMo RL's rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs


@attrs.define(kw_only=True)
class BufferedGroup:
    """One dispatched prompt group."""

    index: int  # dispatch order (0, 1, ...)
    start_version: int  # trainer version whose weights it started sampling with
    ready: bool = False
    payload: Any = None  # the loop's own: prompts, pending generation, then scored rollouts


class GroupSelection(Protocol):
    def may_admit(self, batch_index: int, trainer_version: int) -> bool:
        """Whether the ``batch_index``-th batch of prompts (from 0) may be dispatched now."""

    def select(
        self, groups: Sequence[BufferedGroup], version: int, min_groups: int, max_groups: int
    ) -> list[BufferedGroup] | None:
        """The groups a step at ``version`` takes now (None: fewer than ``min_groups``)."""

    def evict(self, groups: Sequence[BufferedGroup], version: int) -> list[BufferedGroup]:
        """Ready groups that can never be selected any more (dropped untrained)."""


def take(
    eligible: list[BufferedGroup], min_groups: int, max_groups: int
) -> list[BufferedGroup] | None:
    """NeMo RL's greedy finalisation: all eligible up to the cap, none below the minimum."""
    if min_groups < 1 or max_groups < min_groups:
        raise ValueError(f"need 1 <= min_groups ({min_groups}) <= max_groups ({max_groups})")
    if len(eligible) < min_groups:
        return None
    return eligible[:max_groups]


@attrs.frozen
class WindowedSelection:
    max_staleness_versions: int

    def may_admit(self, batch_index: int, trainer_version: int) -> bool:
        return True  # over-sampled: only the buffer's room bounds dispatch

    def select(
        self, groups: Sequence[BufferedGroup], version: int, min_groups: int, max_groups: int
    ) -> list[BufferedGroup] | None:
        oldest = max(0, version - self.max_staleness_versions)
        eligible = [g for g in groups if g.ready and oldest <= g.start_version <= version]
        return take(sorted(eligible, key=lambda g: g.index), min_groups, max_groups)

    def evict(self, groups: Sequence[BufferedGroup], version: int) -> list[BufferedGroup]:
        oldest = max(0, version - self.max_staleness_versions)
        return [g for g in groups if g.ready and g.start_version < oldest]


@attrs.frozen
class ReadyFirstSelection:
    max_staleness_versions: int

    def may_admit(self, batch_index: int, trainer_version: int) -> bool:
        return batch_index <= trainer_version + self.max_staleness_versions

    def select(
        self, groups: Sequence[BufferedGroup], version: int, min_groups: int, max_groups: int
    ) -> list[BufferedGroup] | None:
        eligible = [g for g in groups if g.ready and g.start_version <= version]
        return take(sorted(eligible, key=lambda g: g.index), min_groups, max_groups)

    def evict(self, groups: Sequence[BufferedGroup], version: int) -> list[BufferedGroup]:
        return []  # every admitted group stays selectable: no rollout is discarded


def make_selection(name: str, max_staleness_versions: int) -> GroupSelection:
    """The selection of ``async_rl.sampler.name`` (the config rules admit only these)."""
    if name == "windowed":
        return WindowedSelection(max_staleness_versions)
    if name == "ready_first":
        return ReadyFirstSelection(max_staleness_versions)
    raise ValueError(f"async_rl.sampler.name={name!r} has no group selection in hpcrl")
