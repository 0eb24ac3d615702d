"""Bounds of single numeric fields: the range each may take and why, declared per field.

One row per field (its full key path) in one table per config class (``RECIPE_BOUNDS``,
``PROFILE_BOUNDS``). Each range comes from what the job, a library it calls or the scheduler
can really do with the value, and the message says which: a value past it would be accepted
here and fail (or silently wrap around) after the queue wait. Kept as data, one row per field,
so a bound can move beside its field (an attrs validator) without changing what it says.

Ranges that involve two fields (``max_new_tokens`` within ``max_total_sequence_length``) are
rules of their own (``hpcrl.config.rules``); so are the lower bounds older rules check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from hpcrl.config.errors import Problem

#: numpy's legacy seeding (``np.random.seed``), which vLLM calls with the engine's seed, takes
#: 32-bit seeds; torch takes 64 bits.
MAX_SEED = 2**32 - 1
#: Above the context window of any model (the longest published ones hold about 10 million
#: tokens); the job sizes buffers by it, so a typo like 1e14 fails allocating them.
MAX_SEQUENCE_TOKENS = 2**24
#: Step counts live in 64-bit integers in the job (torch tensors, checkpoints, the loggers).
MAX_STEPS = 2**63 - 1
#: slurmctld keeps a job's restart count in 16 bits (``restart_cnt``): past it,
#: SLURM_RESTART_COUNT, by which the job numbers its attempts, wraps around to 0.
MAX_REQUEUES = 2**16 - 1


@attrs.frozen(kw_only=True)
class FieldBound:
    """The values one field may take (``low``/``high`` inclusive, None: unbounded), the
    reason (``why``, said in the message) and a value that works (``example``).
    ``allowed``: the range in words when plain numbers would mislead (``top_k``)."""

    low: int | None = None
    high: int | None = None
    why: str
    example: str
    allowed: str | None = None

    def contains(self, value: int | float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def describe(self) -> str:
        if self.allowed is not None:
            return self.allowed
        if self.low is not None and self.high is not None:
            return f"in {self.low:,}..{self.high:,}"
        if self.low is not None:
            return f"at least {self.low:,}"
        return f"at most {self.high:,}"

    def problem(self, path: str, value: Any) -> Problem | None:
        """The problem of ``value`` at ``path`` (None: in range, unset, or not a number, which
        the converter reports)."""
        if isinstance(value, bool) or not isinstance(value, int | float) or self.contains(value):
            return None
        return Problem(
            path=path,
            value=value,
            message=f"must be {self.describe()}: {self.why}",
            fix=f"set {path} to {self.example}",
        )


def _seed() -> FieldBound:
    return FieldBound(
        low=0, high=MAX_SEED, example="a number in that range, e.g. 42",
        why="vLLM seeds numpy with it, and numpy takes 32-bit seeds (torch would take 64)",
    )  # fmt: skip


def _steps(section: str) -> FieldBound:
    return FieldBound(
        high=MAX_STEPS, example="the steps to train, e.g. 1000",
        why="the job counts steps in 64-bit integers; to train until "
        f"{section}.max_num_epochs ends, any large count such as 1000000 does",
    )  # fmt: skip


RECIPE_BOUNDS: Mapping[str, FieldBound] = {
    "grpo.seed": _seed(),
    "sft.seed": _seed(),
    "grpo.max_num_steps": _steps("grpo"),
    "sft.max_num_steps": _steps("sft"),
    "policy.max_total_sequence_length": FieldBound(
        high=MAX_SEQUENCE_TOKENS, example="the model's context length or less, e.g. 4096",
        why="longer than any model's context window (the longest hold about 10 million "
        "tokens), and the job sizes its buffers by it",
    ),
    "policy.generation.top_k": FieldBound(
        low=-1, example="null to sample from every token, or a count such as 50",
        allowed="null, 0 or -1 (off), or a count of tokens of at least 1",
        why="sampling keeps the top_k most likely tokens; vLLM refuses anything below -1",
    ),
}  # fmt: skip

PROFILE_BOUNDS: Mapping[str, FieldBound] = {
    "gpus_per_node": FieldBound(
        low=0, example="the GPUs of one node, e.g. 8 (a CPU profile: 0)",
        why="a count of GPUs per node (a CPU profile requests none: 0)",
    ),
    "slurm.max_requeues": FieldBound(
        low=0, high=MAX_REQUEUES, example="the requeues a run may need, e.g. 2 (0: never)",
        why="Slurm counts a job's restarts in 16 bits, and the job numbers its attempts by "
        "that count (SLURM_RESTART_COUNT wraps around past 65,535)",
    ),
}  # fmt: skip


def check_bounds(config: Any, bounds: Mapping[str, FieldBound]) -> list[Problem]:
    """A problem per field of ``config`` (a Recipe or a ClusterProfile) outside its bound."""
    found = (
        bound.problem(path, value)
        for path, bound in bounds.items()
        for value in _values_at(config, path.split("."))
    )
    return [problem for problem in found if problem is not None]


def _values_at(config: Any, parts: list[str]) -> Iterable[Any]:
    """The value at ``parts``; nothing when a section on the way is unset (``sft: null``)."""
    for part in parts:
        config = getattr(config, part, None)
        if config is None:
            return ()
    return (config,)
