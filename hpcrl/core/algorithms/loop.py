"""What GRPO and SFT loops share: saving and keeping checkpoints, the preemption request,
step timing. Where checkpoints live and which are complete is ``hpcrl.run.checkpoints``."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.run.checkpoints import (
    CONSOLIDATED_SUBDIR,
    METRICS_INDEX,
    complete_checkpoints,
    latest_checkpoint,
    step_dir_name,
)
from hpcrl.run.markers import PREEMPT_FILE

if TYPE_CHECKING:
    from hpcrl.core.policy import Policy


class CheckpointStore:
    """Saves through the policy every ``save_period`` steps and keeps what NeMo RL's
    CheckpointManager keeps: with ``keep``, the ``keep`` best of the periodic checkpoints
    (steps that are multiples of ``save_period``) — best by the step-record key ``metric``
    (``hpcrl.config.checkpoint_metrics``; a checkpoint without it ranks last, ties go to the
    newer), or without one the newest — and always the newest checkpoint, which a resumed
    run starts from."""

    def __init__(
        self,
        policy: Policy,
        checkpoint_dir: str | Path,
        save_period: int | None,
        keep: int | None,
        metric: str | None = None,
        higher_is_better: bool = True,
        consolidated: Mapping[str, str] | None = None,
    ) -> None:
        self.policy = policy
        self.checkpoint_dir = Path(checkpoint_dir)
        self.save_period = save_period  # None: only on request (preemption, end of run)
        self.keep = keep
        self.metric = metric
        self.higher_is_better = higher_is_better
        # save_consolidated: also write <checkpoint>/hf; the run_dir and backend to record
        self.consolidated = consolidated

    def due(self, step: int) -> bool:
        return (
            self.save_period is not None and self.save_period > 0 and step % self.save_period == 0
        )

    def save(
        self,
        step: int,
        extra_state: Mapping[str, Any],
        record: Mapping[str, Any] | None = None,
        *,
        in_a_hurry: bool = False,
    ) -> Path:
        """``in_a_hurry`` (a preemption's save, before Slurm's kill): no Hugging Face folder,
        which ``hpcrl export`` can write later from the checkpoint."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        target = self.checkpoint_dir / step_dir_name(step)
        self.policy.save_checkpoint(str(target), {**extra_state, "step": step})
        if self.consolidated is not None and not in_a_hurry:
            self._write_consolidated(target, step, self.consolidated)
        if self.metric is not None:
            self._remember(step, (record or {}).get(self.metric))
        self._prune()
        return target

    def _write_consolidated(self, target: Path, step: int, about: Mapping[str, str]) -> None:
        """``<checkpoint>/hf``: the weights just saved as a Hugging Face folder, complete or
        absent (written as ``hf.partial``, renamed last)."""
        from hpcrl.core.export import write_record

        folder = target / CONSOLIDATED_SUBDIR
        partial = target / f"{CONSOLIDATED_SUBDIR}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        self.policy.export_hf(str(partial))
        write_record(partial, about["run_dir"], target, step, about["backend"],
                     "checkpointing.save_consolidated")  # fmt: skip
        partial.rename(folder)

    def _remember(self, step: int, value: Any) -> None:
        index = self._metrics()
        index[str(step)] = value if isinstance(value, int | float) else None
        path = self.checkpoint_dir / METRICS_INDEX
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(index, sort_keys=True))
        partial.replace(path)

    def _metrics(self) -> dict[str, Any]:
        path = self.checkpoint_dir / METRICS_INDEX
        return json.loads(path.read_text()) if path.is_file() else {}

    def _prune(self) -> None:
        if not self.keep:
            return
        found = complete_checkpoints(self.checkpoint_dir)
        kept = self._kept(found)
        for item in found:
            if item not in kept:
                shutil.rmtree(item[1], ignore_errors=True)

    def _kept(self, found: list[tuple[int, Path]]) -> list[tuple[int, Path]]:
        assert self.keep
        period = self.save_period or 0
        periodic = [item for item in found if period > 0 and item[0] % period == 0]
        if self.metric is None:
            best = sorted(periodic, reverse=True)[: self.keep]
        else:
            best = sorted(periodic, key=self._rank, reverse=True)[: self.keep]
        newest = found[-1:] if found and found[-1] not in best else []
        return best + newest

    def _rank(self, item: tuple[int, Path]) -> tuple[bool, float, int]:
        """Sort key, higher is kept first: has the metric, its value (negated when lower is
        better), then the newer step."""
        value = self._metrics().get(str(item[0]))
        if value is None:
            return (False, 0.0, item[0])
        return (True, value if self.higher_is_better else -value, item[0])

    def restore_latest(self) -> dict[str, Any] | None:
        """Load the newest complete checkpoint into the policy; its extra_state, or None."""
        latest = latest_checkpoint(self.checkpoint_dir)
        if latest is None:
            return None
        return self.policy.load_checkpoint(str(latest))


class PreemptionWatch:
    """True once ``<run_dir>/PREEMPT`` exists or this process got SIGUSR2."""

    def __init__(self, run_dir: str | Path) -> None:
        self.marker = Path(run_dir) / PREEMPT_FILE
        self.signalled = False

    @contextmanager
    def installed(self) -> Iterator[PreemptionWatch]:
        """Handle SIGUSR2 while inside (main thread only; elsewhere the file still works)."""
        try:
            previous = signal.signal(signal.SIGUSR2, self._on_signal)
        except ValueError:  # not the main thread
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGUSR2, previous)

    def _on_signal(self, signum: int, frame: Any) -> None:
        del signum, frame
        self.signalled = True

    def requested(self) -> bool:
        return self.signalled or self.marker.exists()


class StepTimer:
    """Wall time of named phases within one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def as_metrics(self) -> dict[str, float]:
        return {f"time_{name}_s": value for name, value in self.seconds.items()}


def generation_seed(seed: int, step: int) -> int:
    """Sampling seed of one step: depends on (seed, step) only, so a resumed run draws the
    same samples it would have drawn without the interruption."""
    return (seed * 1_000_003 + step) % (2**31 - 1)
