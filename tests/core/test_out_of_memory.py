"""A training worker's phase that runs out of GPU memory raises ``GpuOutOfMemory`` naming the
phase and the peak (hpcrl.core.workers.out_of_memory); other errors pass unchanged."""

from __future__ import annotations

import pytest

from hpcrl.core.workers.actor import TrainingWorker
from hpcrl.core.workers.out_of_memory import GpuOutOfMemory, names_gpu_out_of_memory
from hpcrl.run.causes import GPU_OOM_ERROR, parse_gpu_oom
from tests.require import require_module

torch = require_module("torch")


class PretendBackend:
    """Test stand-in for a backend worker: reports a peak, as the real ones do on CUDA."""

    def __init__(self, peak_gb: float) -> None:
        self.peak_gb = peak_gb

    def collect_state(self) -> dict:
        return {"peak_memory_gb": self.peak_gb}

    def logprobs(self, shard, plan):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0")

    def reference_logprobs(self, shard, plan):
        raise ValueError("not memory")


def test_the_phase_and_the_backends_peak_are_named():
    worker = TrainingWorker("unused:Class")
    worker._backend = PretendBackend(peak_gb=97.5)
    with pytest.raises(GpuOutOfMemory) as caught:
        worker.logprobs({}, [])
    assert str(caught.value) == (
        "out of GPU memory at logprobs, peak 97.5 GiB: CUDA out of memory. Tried to allocate "
        "20.00 GiB. GPU 0"
    )
    assert isinstance(caught.value.__cause__, torch.cuda.OutOfMemoryError)
    assert parse_gpu_oom(str(caught.value))[:2] == (
        "out of GPU memory at logprobs, peak 97.5 GiB",
        97.5,
    )
    with pytest.raises(ValueError, match="not memory"):
        worker.reference_logprobs({}, [])
    assert GpuOutOfMemory.__name__ == GPU_OOM_ERROR  # node 0 knows it by this name


def test_without_a_peak_the_message_says_unknown():
    class Bare:
        def gpu_memory_gb(self):
            return None, None

        @names_gpu_out_of_memory("setup")
        def setup(self):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    with pytest.raises(GpuOutOfMemory, match=r"^out of GPU memory at setup, peak unknown: CUDA"):
        Bare().setup()
