"""A training worker that runs out of GPU memory says where and how full the GPU was.

CUDA's ``OutOfMemoryError`` inside any phase of a ``TrainingWorker`` (setup, generate,
log-probs, train, moving the optimizer back, ...) is raised again as ``GpuOutOfMemory``, whose
first line is ``hpcrl.run.causes.gpu_oom_text``: ``out of GPU memory at train, peak 131.2 GiB of
139.8 GiB: CUDA out of memory. Tried to allocate ...``. The driver names the rank
(``WorkerFailed``), node 0 records the attempt's cause as ``gpu_oom`` with its peak
(``hpcrl.job.diagnosis``), and ``hpcrl status`` / ``report`` show the run as out of memory:
a sweep over memory settings (offload fractions, activation checkpointing) reads which
points fit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from hpcrl.run.causes import gpu_oom_text

Method = TypeVar("Method", bound=Callable[..., Any])


class GpuOutOfMemory(RuntimeError):
    """CUDA ran out of memory in a phase of a training worker (``gpu_oom_text`` message).
    Node 0 knows it by its name, ``hpcrl.run.causes.GPU_OOM_ERROR`` (a test holds them equal)."""


def is_gpu_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.cuda.OutOfMemoryError)


def names_gpu_out_of_memory(phase: str) -> Callable[[Method], Method]:
    """Decorate a ``TrainingWorker`` method: CUDA's out-of-memory error in it becomes
    ``GpuOutOfMemory`` naming ``phase`` and the peak (``self.gpu_memory_gb()``)."""

    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as error:
                if not is_gpu_out_of_memory(error):
                    raise
                peak_gb, capacity_gb = self.gpu_memory_gb()
                raise GpuOutOfMemory(
                    gpu_oom_text(phase, peak_gb, capacity_gb, str(error))
                ) from error

        return call  # type: ignore[return-value]

    return decorate


def cuda_memory_gb() -> tuple[float | None, float | None]:
    """(peak allocated, capacity) of this process's GPU in GiB; (None, None) without CUDA."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None, None
    capacity = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return torch.cuda.max_memory_allocated() / 2**30, capacity / 2**30
