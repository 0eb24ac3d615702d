"""How a loss metric's per-micro-batch values combine into one figure per step.

Most loss metrics are shares of a global mean (hpcrl.core.algorithms.losses): they add up
over micro-batches and data-parallel ranks, and a step's optimizer steps are averaged.
Extrema are named ``*_min`` / ``*_max`` (NeMo RL's ``probs_ratio_min`` ...): they combine
with min / max everywhere. A part without counted tokens gives +inf / −inf (NeMo RL's
sentinels); a step without any is reported as −1.0, as NeMo RL does.

Shared by both backends (the Automodel worker and the Megatron step) and the controller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Reduction = Literal["sum", "min", "max"]
NO_VALUE = -1.0  # NeMo RL's figure for an extremum over no tokens


def reduction_of(name: str) -> Reduction:
    if name.endswith("_min"):
        return "min"
    if name.endswith("_max"):
        return "max"
    return "sum"


def accumulate(totals: MutableMapping[str, Any], name: str, value: Any) -> None:
    """Fold one micro-batch's ``value`` (float or 0-dim tensor) into ``totals[name]``."""
    if name not in totals:
        totals[name] = value
        return
    kind = reduction_of(name)
    current = totals[name]
    if kind == "sum":
        totals[name] = current + value
        return
    tensors = [v for v in (current, value) if not isinstance(v, int | float)]
    if tensors:
        import torch

        pick = torch.minimum if kind == "min" else torch.maximum
        like = tensors[0]
        totals[name] = pick(torch.as_tensor(current).to(like), torch.as_tensor(value).to(like))
    else:
        totals[name] = min(current, value) if kind == "min" else max(current, value)


def all_reduce_metrics(
    values: Mapping[str, Any],
    names: Sequence[str],
    device: torch.device,
    *,
    sum_divisor: float = 1.0,
    contributes: bool = True,
    replicated: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Combine ``values`` over all ranks of the default group, at most two collectives and
    one read-back; every rank gets the result. ``names``: the same list on every rank.
    ``contributes=False``: this rank's values are left out (it holds copies or nothing).
    ``sum_divisor``: how many ranks hold each contributed sum (TP peers). ``replicated``:
    figures every rank already holds alike (the global gradient norm), read back with the
    rest instead of by a host wait of their own."""
    import torch
    import torch.distributed as dist

    sums = [n for n in names if reduction_of(n) == "sum"]
    extremes = [n for n in names if reduction_of(n) != "sum"]
    kept = dict(replicated or {})

    def local(name: str, empty: float) -> torch.Tensor:
        value = values.get(name, empty) if contributes else empty
        return torch.as_tensor(value, dtype=torch.float64, device=device).reshape(())

    parts: list[torch.Tensor] = []
    signs: list[float] = []
    if sums:
        packed = torch.stack([local(n, 0.0) for n in sums])
        dist.all_reduce(packed)
        parts.append(packed / sum_divisor)
    if extremes:
        # min(x) = −max(−x): one MAX reduction serves both kinds.
        signs = [1.0 if reduction_of(n) == "max" else -1.0 for n in extremes]
        packed = torch.stack(
            [sign * local(n, -math.inf * sign) for n, sign in zip(extremes, signs, strict=True)]
        )
        dist.all_reduce(packed, op=dist.ReduceOp.MAX)
        parts.append(packed)
    if kept:
        parts.append(
            torch.stack(
                [
                    torch.as_tensor(v, dtype=torch.float64, device=device).reshape(())
                    for v in kept.values()
                ]
            )
        )
    if not parts:
        return {}
    read_back = torch.cat(parts).tolist()  # the one host wait
    result = dict(zip(sums, read_back[: len(sums)], strict=True))
    extreme_values = read_back[len(sums) : len(sums) + len(extremes)]
    result.update((n, sign * v) for n, sign, v in zip(extremes, signs, extreme_values, strict=True))
    result.update(zip(kept, read_back[len(sums) + len(extremes) :], strict=True))
    return result


def combine_optimizer_steps(results: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One record from the results of a GRPO step's optimizer steps: sums averaged, extrema
    combined; an extremum that saw no token becomes ``NO_VALUE``."""
    combined: dict[str, float] = {}
    for name in results[0]:
        values = [float(r[name]) for r in results]
        kind = reduction_of(name)
        if kind == "sum":
            combined[name] = sum(values) / len(values)
            continue
        value = min(values) if kind == "min" else max(values)
        combined[name] = value if math.isfinite(value) else NO_VALUE
    return combined
