"""Local JSONL data sets with a deterministic, resumable order.

Each epoch visits every row once, in an order drawn from ``(seed, epoch)`` alone, so a run
restored from a checkpoint's ``DataPosition`` sees exactly the rows it would have seen.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class DataPosition:
    """Where the next row comes from: ``index`` into epoch ``epoch``'s order."""

    epoch: int = 0
    index: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataPosition:
        return cls(epoch=int(data["epoch"]), index=int(data["index"]))


def load_jsonl(path: str | Path, required_keys: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of a JSONL file; errors name the file, line and missing key."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({error.msg})") from None
            missing = [key for key in required_keys if key not in row]
            if missing:
                raise ValueError(
                    f"{path}:{line_number}: missing key(s) {', '.join(missing)}; set "
                    "data.prompt_key / data.answer_key / data.response_key to the names the file uses"
                )
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: the data set is empty")
    return rows


class EpochSampler:
    """Hands out rows in batches, epoch after epoch, from a resumable position."""

    def __init__(self, rows: Sequence[dict[str, Any]], seed: int, shuffle: bool = True) -> None:
        self.rows = list(rows)
        self.seed = seed
        self.shuffle = shuffle
        self.position = DataPosition()
        self._order_epoch = -1
        self._order: list[int] = []

    def epoch_order(self, epoch: int) -> list[int]:
        """Row indices of ``epoch`` (a pure function of seed and epoch)."""
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list[dict[str, Any]]:
        """``size`` rows, continuing into the next epoch when this one runs out."""
        batch: list[dict[str, Any]] = []
        while len(batch) < size:
            epoch, index = self.position.epoch, self.position.index
            if epoch != self._order_epoch:
                self._order, self._order_epoch = self.epoch_order(epoch), epoch
            batch.append(self.rows[self._order[index]])
            index += 1
            if index == len(self.rows):
                epoch, index = epoch + 1, 0
            self.position = DataPosition(epoch=epoch, index=index)
        return batch

    def restore(self, position: DataPosition) -> None:
        self.position = position
