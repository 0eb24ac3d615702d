"""Bounds of single numeric fields, declared beside the field they bound.

A schema field that has a range is written ``lr: float = bounded(1e-5, AT_LEAST_ZERO)``:
``bounded`` is ``attrs.field`` with the bounds in the field's metadata, so the range, the
reason and the fix sit next to the field's type and default. ``check_field_bounds`` walks a
whole Recipe or ClusterProfile once and returns a problem per value outside a bound, each
with its full key path (list items as ``scheduler[2]``), the value and the fix: every one of
them, never stopping at the first (an attrs validator would raise at the first).

Each range comes from what the job, a library it calls or the scheduler can really do with
the value, and the message says which: a value past it would be accepted here and fail (or
silently wrap around) after the queue wait. A bound may hold only while a switch of its own
section, and of every section around it that has one, is on (``when="enabled"``: a field
of ``policy.megatron_cfg.optimizer`` is checked while ``policy.megatron_cfg.enabled`` is
true; a tuple names several switches). One bound of a field may have switches of its own
(``FieldBound(when=...)``, looked up the same way): ``optimizer_offload_fraction`` is in
[0, 1] while Megatron is enabled, and above 0 while ``optimizer_cpu_offload`` is on too.
A field outside several of its bounds is reported once, by the first. Ranges that involve
another section's field
(``max_new_tokens`` within ``max_total_sequence_length``, vLLM's sizes while
``policy.generation.backend`` is vllm) are cross-field rules (``hpcrl.config.rules`` and the
``*_rules`` modules).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from hpcrl.config.errors import Problem
from hpcrl.config.shared_methods import SharedMethods

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
#: Far above any cluster (the largest have ~10,000 nodes): a count beyond it is a typo.
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
MAX_WORKER_SLOTS_PER_NODE = 1024
#: Slurm CPUs (hardware threads) and memory of one node: the largest single machines have
#: ~1,800 threads and 32-48 TB; beyond these a value is a typo.
MAX_CPUS_PER_NODE = 4096
MAX_MEM_GB_PER_NODE = 65_536
#: Prompts or samples of one training step: far above any GRPO or SFT batch (NeMo RL's
#: largest recipes take a few thousand); beyond it a value is a typo.
MAX_BATCH = 1_000_000

_BOUNDS_KEY = "hpcrl_bounds"
_WHEN_KEY = "hpcrl_bounds_when"


@attrs.frozen(kw_only=True)
class FieldBound(SharedMethods):
    """The values one field may take and what to say when it holds another.

    ``low``/``high``: the ends (None: unbounded), inclusive unless ``low_open``/``high_open``.
    ``message``: what is wrong (default: "must be <the range>", then ": <why>" when given).
    ``allowed``: the range in words when plain numbers would mislead (``top_k``).
    ``fix``: what to change; ``{path}`` in it (and in ``message``) becomes the field's key
    path, ``{section}`` the path of the section that holds the field.
    ``when``: switches that must be on, as ``bounded``'s, for this bound to hold."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    fix: str
    message: str | None = None
    why: str = ""
    allowed: str | None = None
    when: str | tuple[str, ...] | None = None

    def contains(self, value: int | float) -> bool:
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return low_ok and high_ok

    def describe(self) -> str:
        if self.allowed is not None:
            return self.allowed
        if self.low is not None and self.high is not None:
            if self.low_open or self.high_open or isinstance(self.high, float):
                left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
                return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"
            return f"in {self.low:,}..{self.high:,}"
        if self.low is not None:
            return ("above " if self.low_open else "at least ") + _number(self.low)
        return ("below " if self.high_open else "at most ") + _number(self.high)

    def problem(self, path: str, value: Any) -> Problem | None:
        """The problem of ``value`` at ``path`` (None: in range, unset, or not a number, which
        the converter reports)."""
        if isinstance(value, bool) or not isinstance(value, int | float) or self.contains(value):
            return None
        message = self.message or f"must be {self.describe()}" + (
            f": {self.why}" if self.why else ""
        )
        section = path.rpartition(".")[0]
        return Problem(
            path=path,
            value=value,
            message=message.replace("{path}", path).replace("{section}", section),
            fix=self.fix.replace("{path}", path).replace("{section}", section),
        )


def _number(value: float | None) -> str:
    # 0.0 reads "0" and 100000 "100,000", as the messages always said them
    if isinstance(value, float):
        return f"{value:g}"
    return f"{value:,}"


def bounded(default: Any, *bounds: FieldBound, when: str | tuple[str, ...] | None = None) -> Any:
    """An attrs field with ``default`` whose values must lie within every one of ``bounds``
    (a value outside several is reported by the first); with ``when``, only while that switch of the same section is
    true, and in every enclosing section that has that switch (``when="enabled"``: settings
    under a disabled backend are not checked); a tuple names several switches, all on."""
    return attrs.field(default=default, metadata={_BOUNDS_KEY: bounds, _WHEN_KEY: when})


def bounds_of(field: attrs.Attribute[Any]) -> tuple[FieldBound, ...]:
    return tuple(field.metadata.get(_BOUNDS_KEY, ()))


def check_field_bounds(config: Any, path: str = "") -> list[Problem]:
    """A problem per field of ``config`` (a Recipe, a ClusterProfile or any section of them)
    outside one of its bounds, in schema order; sections left unset are skipped."""
    return list(_field_problems(config, path))


def _field_problems(config: Any, path: str, enclosing: tuple[Any, ...] = ()) -> Iterator[Problem]:
    sections = (config, *enclosing)  # innermost first: where a ``when`` switch is looked up
    for field in attrs.fields(type(config)):
        value = getattr(config, field.name)
        field_path = f"{path}.{field.name}" if path else field.name
        when = field.metadata.get(_WHEN_KEY)
        if when is None or _switch(sections, when):
            problem = _first_problem(bounds_of(field), sections, field_path, value)
            if problem is not None:
                yield problem
        if attrs.has(type(value)):
            yield from _field_problems(value, field_path, sections)
        elif isinstance(value, tuple | list):
            for index, item in enumerate(value):
                if attrs.has(type(item)):
                    yield from _field_problems(item, f"{field_path}[{index}]", sections)


def _first_problem(
    bounds: tuple[FieldBound, ...], sections: tuple[Any, ...], path: str, value: Any
) -> Problem | None:
    for bound in bounds:
        if bound.when is None or _switch(sections, bound.when):
            problem = bound.problem(path, value)
            if problem is not None:
                return problem
    return None


def _switch(sections: tuple[Any, ...], when: str | tuple[str, ...]) -> bool:
    """Whether every switch in ``when`` is on in each enclosing section that has it (the
    field's own first): ``enabled`` of ``policy.megatron_cfg`` for a field of
    ``policy.megatron_cfg.optimizer``; both ``enabled`` of ``lora_cfg`` and of
    ``automodel_cfg`` for a LoRA field."""
    names = (when,) if isinstance(when, str) else when
    return all(
        bool(getattr(section, name))
        for name in names
        for section in sections
        if hasattr(section, name)
    )


# --------------------------------------------------------------------------- shared bounds
def at_least(low: float, fix: str) -> FieldBound:
    """``must be at least <low>``, as the plain lower bounds say it."""
    return FieldBound(low=low, fix=fix)


POSITIVE_COUNT = at_least(1, "set {path} to a positive integer")
PARALLEL_SIZE = FieldBound(
    low=1, message="a parallel size must be at least 1", fix="set {path}=1 (or larger)"
)
AT_LEAST_ZERO = at_least(0.0, "a number >= 0")


def seed_bound() -> FieldBound:
    return FieldBound(
        low=0, high=MAX_SEED, fix="set {path} to a number in that range, e.g. 42",
        why="vLLM seeds numpy with it, and numpy takes 32-bit seeds (torch would take 64)",
    )  # fmt: skip


def steps_bound(section: str) -> FieldBound:
    return FieldBound(
        high=MAX_STEPS, fix="set {path} to the steps to train, e.g. 1000",
        why="the job counts steps in 64-bit integers; to train until "
        f"{section}.max_num_epochs ends, any large count such as 1000000 does",
    )  # fmt: skip


def allocation_bound(limit: int) -> FieldBound:
    """A recipe's node or per-node count that no cluster has (``cluster.num_nodes=1e20``)."""
    return FieldBound(
        high=limit, message=f"more than any cluster has (at most {limit:,})",
        fix="set {path} to the allocation the recipe is written for",
    )  # fmt: skip


def batch_bound() -> FieldBound:
    return FieldBound(
        high=MAX_BATCH, message=f"more than any training step takes (at most {MAX_BATCH:,})",
        fix="set {path} to what one step trains on, e.g. 32",
    )  # fmt: skip


def node_has_bound(limit: int, unit: str = "") -> FieldBound:
    """A per-node count of a profile no node has (it would be rendered as ``--mem=1e20G``)."""
    return FieldBound(
        high=limit, message=f"more than any node has (at most {limit}{unit})",
        fix="set {path} to what one node of the site has"
        + (", or remove it for Slurm's default" if unit else ""),
    )  # fmt: skip
