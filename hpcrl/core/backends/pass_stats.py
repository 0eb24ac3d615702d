"""What a backend worker's train and log-prob passes did, for the per-step metrics.

Per kind of pass (``train``, ``logprobs``, ``reference``), summed over the passes of a step:
micro-batches, token slots (positions the forwards computed, padding included) against real
tokens (attention-mask ones), and seconds on the worker. A train pass also splits its time
into forward/backward (with the gradient norm) and the optimizer part (clipping, the
optimizer and scheduler step, the metrics' all-reduce). On a GPU the split point is a CUDA
event (the host does not wait for the backward before it queues the optimizer step), read
after the step's one read-back: the split adds no synchronisation.

Host synchronisations are counted on request (``HPCRL_COUNT_HOST_SYNCS=1`` in the workers'
environment, CUDA only): torch's sync debug mode warns at every operation that makes the
host wait for the device (``.item()``, ``.cpu()``, ``.tolist()``, ``nonzero``, a blocking
copy); the warnings are counted, not shown. A diagnostic: it slows the passes a little.

``HPCRL_PROFILE_PASSES=<folder>`` (a diagnostic for performance work): the
``HPCRL_PROFILE_PASS_INDEX``-th pass of each kind (default the 4th, after the first steps'
compilations) runs under torch.profiler and its summary (``hpcrl.core.profiling``) is
written to ``<folder>/<kind>-pid<pid>.txt``.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import torch

COUNT_SYNCS_ENV = "HPCRL_COUNT_HOST_SYNCS"
PROFILE_DIR_ENV = "HPCRL_PROFILE_PASSES"
PROFILE_INDEX_ENV = "HPCRL_PROFILE_PASS_INDEX"


@attrs.define
class PassStats:
    """One kind of pass, summed until ``PassRecorder.take``."""

    passes: int = 0
    micro_batches: int = 0
    token_slots: int = 0
    real_tokens: int = 0
    seconds: float = 0.0
    forward_backward_s: float = 0.0  # train passes only
    optimizer_s: float = 0.0  # train passes only
    host_syncs: int | None = None  # None: not counted

    def add_micro_batch(self, micro: Mapping[str, torch.Tensor]) -> None:
        """A micro-batch as the forward gets it (on the device, padded to its bucket)."""
        ids = micro.get("packed_input_ids", micro["input_ids"])
        self.micro_batches += 1
        self.token_slots += int(ids.numel())

    def as_metrics(self, kind: str) -> dict[str, float]:
        metrics = {
            f"{kind}_passes": float(self.passes),
            f"{kind}_micro_batches": float(self.micro_batches),
            f"{kind}_token_slots": float(self.token_slots),
            f"{kind}_real_tokens": float(self.real_tokens),
            f"time_{kind}_worker_s": self.seconds,
        }
        if kind == "train":
            metrics["time_train_forward_backward_s"] = self.forward_backward_s
            metrics["time_train_optimizer_s"] = self.optimizer_s
        if self.host_syncs is not None:
            metrics[f"{kind}_host_syncs"] = float(self.host_syncs)
        return metrics


class TrainSplit:
    """Where a train pass's time goes: forward/backward until ``backward_done``, the
    optimizer part until ``finish`` (called after the step's read-back). Host clocks on the
    CPU, CUDA events on a GPU: seconds the device spent, read without a wait of their own."""

    def __init__(self, device: torch.device) -> None:
        import torch

        self._events = device.type == "cuda"
        if self._events:
            self._marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            self._marks[0].record()
        self._times = [time.perf_counter()]

    def backward_done(self) -> None:
        self._mark()

    def finish(self, stats: PassStats) -> None:
        self._mark()
        if self._events:
            self._marks[2].synchronize()  # the read-back came first: already done
            start, middle, end = self._marks
            stats.forward_backward_s += start.elapsed_time(middle) / 1e3
            stats.optimizer_s += middle.elapsed_time(end) / 1e3
        else:
            start_s, middle_s, end_s = self._times
            stats.forward_backward_s += middle_s - start_s
            stats.optimizer_s += end_s - middle_s

    def _mark(self) -> None:
        if self._events:
            self._marks[len(self._times)].record()
        self._times.append(time.perf_counter())


class PassRecorder:
    """A worker's ``PassStats`` per kind of pass."""

    def __init__(self, device: torch.device) -> None:
        self.count_syncs = device.type == "cuda" and os.environ.get(COUNT_SYNCS_ENV) == "1"
        self._stats: dict[str, PassStats] = {}
        self.profile_dir = os.environ.get(PROFILE_DIR_ENV) or None
        self.profile_index = int(os.environ.get(PROFILE_INDEX_ENV) or 4)
        self._lifetime_passes: dict[str, int] = {}

    @contextlib.contextmanager
    def measure(self, kind: str, real_tokens: int) -> Iterator[PassStats]:
        """Time one pass (the body must end with the device done, e.g. a read-back)."""
        stats = self._stats.setdefault(kind, PassStats())
        self._lifetime_passes[kind] = self._lifetime_passes.get(kind, 0) + 1
        started = time.perf_counter()
        with self._profiling(kind), self._counting_syncs(stats):
            yield stats
        stats.seconds += time.perf_counter() - started
        stats.passes += 1
        stats.real_tokens += real_tokens

    def _profiling(self, kind: str) -> contextlib.AbstractContextManager[None]:
        if self.profile_dir is None or self._lifetime_passes[kind] != self.profile_index:
            return contextlib.nullcontext()
        from hpcrl.core.profiling import profiled

        path = os.path.join(self.profile_dir, f"{kind}-pid{os.getpid()}.txt")
        return profiled(path, f"{kind} pass #{self.profile_index} (pid {os.getpid()})")

    @contextlib.contextmanager
    def _counting_syncs(self, stats: PassStats) -> Iterator[None]:
        if not self.count_syncs:
            yield
            return
        import torch

        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        syncs = 0
        for caught_warning in caught:
            if "synchroniz" in str(caught_warning.message):
                syncs += 1
            else:  # not ours to swallow
                warnings.warn_explicit(
                    caught_warning.message,
                    caught_warning.category,
                    caught_warning.filename,
                    caught_warning.lineno,
                )
        stats.host_syncs = (stats.host_syncs or 0) + syncs

    def take(self) -> dict[str, float]:
        """Every kind's figures since the last call, as metrics; then start again."""
        metrics: dict[str, float] = {}
        for kind, stats in sorted(self._stats.items()):
            metrics.update(stats.as_metrics(kind))
        self._stats = {}
        return metrics
