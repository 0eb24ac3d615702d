"""A GPU too small for a sweep point, and the real training driver that meets it
(``HPCRL_DRIVER=tests.submit.oom_standin:train_with_a_small_gpu``).

Test stand-in: CPU runs have no GPU memory to run out of. ``SmallGpuWorker`` is the real
Automodel worker (real model, FSDP2 on gloo, real GRPO steps) except that its train step
raises CUDA's own ``torch.cuda.OutOfMemoryError`` when activation checkpointing is off, as if
the activations did not fit, and that it reports a made-up peak GPU memory (``PRETEND_PEAK_GB``,
by activation checkpointing), which CPU runs otherwise leave at 0. Everything after the
exception is hpcrl's: the worker naming it (``GpuOutOfMemory``), the driver, the node's cause
record, ``hpcrl status`` and ``hpcrl report``.
"""

from __future__ import annotations

from typing import Any

import torch

from hpcrl.core.backends.automodel.worker import AutomodelWorker

#: activation checkpointing -> the peak GPU memory this pretend GPU reports (GiB)
PRETEND_PEAK_GB = {False: 131.5, True: 70.25}
STAND_IN_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB (test stand-in)"


class SmallGpuWorker(AutomodelWorker):
    def _checkpointing(self) -> bool:
        return bool(self.recipe.policy.automodel_cfg.activation_checkpointing)

    def train_step(self, micro_batches: Any, loss_fn: Any, num_global_tokens: float) -> Any:
        if not self._checkpointing():
            raise torch.cuda.OutOfMemoryError(STAND_IN_MESSAGE)
        return super().train_step(micro_batches, loss_fn, num_global_tokens)

    def collect_state(self) -> dict[str, Any]:
        return {**super().collect_state(), "peak_memory_gb": PRETEND_PEAK_GB[self._checkpointing()]}


def train_with_a_small_gpu(run_dir: str) -> int:
    """hpcrl's training driver (``run_training``), its Automodel workers ``SmallGpuWorker``s."""
    from hpcrl.core import backends
    from hpcrl.core.driver import run_training

    backends.WORKER_CLASS_PATHS["automodel"] = f"{__name__}:{SmallGpuWorker.__name__}"
    return run_training(run_dir)
