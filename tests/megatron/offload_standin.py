"""Test-only stand-in that lets megatron-core's HybridDeviceOptimizer (optimizer CPU offload)
run on this CPU machine, so the offload fractions can be trained and compared here.

Why: HybridDeviceOptimizer decides what to offload by ``param.is_cuda``. On a CPU machine
nothing is on the device, so it would offload nothing and every fraction would run the same
code: a comparison of losses would be vacuous. It also copies into pinned memory and overlaps
the copies on CUDA streams, neither of which exists without CUDA.

What the stand-in changes — only where tensors claim to live:
- while HybridDeviceOptimizer splits its parameters, the parameters it was given answer
  ``is_cuda`` with True (they play the GPU's part); the copies it makes for the host do not;
- ``Tensor.pin_memory()`` returns the tensor and the pinned grad buffers are plain ones;
- ``torch.cuda.current_stream`` / ``Stream`` / ``stream`` are null streams whose events are
  already complete (CPU work is synchronous);
(hpcrl's own refusal of offload on a CPU plan is the job's preflight, which these ranks do
not run: hpcrl.core.machine_checks.)

What runs unchanged: megatron-core's split by fraction, the separate host copies, the two
sub-optimizers (the CPU one on the copies, the "GPU" one in place), the gradient copies to the
host copies, the copy back after the CPU step, and the syncing of state and param groups (lr
from the scheduler). Every upstream fragment this relies on is checked first, as in
``hpcrl/core/backends/megatron/cpu_compat.py``; apply in a spawned test rank only
(``apply_for_process_lifetime``).
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.overrides import TorchFunctionMode

_HDO = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer:HybridDeviceOptimizer"
REQUIRES = (
    (f"{_HDO}._get_sub_optimizer_param_groups", "param.is_cuda"),
    (f"{_HDO}._get_sub_optimizer_param_groups", ".cpu().pin_memory()"),
    (f"{_HDO}._set_sub_optimizer_grads", "pin_memory=self.pin_cpu_grads"),
    (f"{_HDO}._init_sub_optimizers", "torch.cuda.current_stream()"),
    (f"{_HDO}._init_sub_optimizers", "torch.cuda.Stream()"),
    (f"{_HDO}.step", "torch.cuda.stream(self._d2h_stream)"),
    (f"{_HDO}._register_param_copy_back_gpu_hook", "torch.cuda.stream(self._h2d_stream)"),
)


class _NullEvent:
    def synchronize(self) -> None:
        pass

    def wait(self, stream: object = None) -> None:
        pass


class _NullStream:
    """A CUDA stream on a machine where all work is synchronous."""

    def wait_stream(self, stream: object) -> None:
        pass

    def record_event(self, event: object = None) -> _NullEvent:
        return _NullEvent()


class _DeviceResidentMode(TorchFunctionMode):
    """``is_cuda`` is True exactly for the given tensors; ``pin_memory()`` is a no-op."""

    def __init__(self, device_tensor_ids: set[int]) -> None:
        super().__init__()
        self.device_tensor_ids = device_tensor_ids

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__self__", None) is torch._C.TensorBase.is_cuda:
            return id(args[0]) in self.device_tensor_ids
        if func is torch.Tensor.pin_memory:
            return args[0]
        return func(*args, **(kwargs or {}))


def check_fragments() -> None:
    from hpcrl.core.backends.megatron.cpu_compat import CpuCompatError, _resolve

    for consumer, fragment in REQUIRES:
        if fragment not in inspect.getsource(_resolve(consumer)):
            raise CpuCompatError(
                f"offload stand-in no longer applies: {consumer} no longer contains {fragment!r}"
            )


def apply_for_process_lifetime() -> None:
    """Install the stand-in in this (spawned, short-lived) process; never undone."""
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    check_fragments()
    original_init = HybridDeviceOptimizer.__init__
    original_split = HybridDeviceOptimizer._get_sub_optimizer_param_groups

    def init_without_pinned_memory(self, params, **kwargs):
        kwargs.update(pin_cpu_grads=False, pin_cpu_params=False)
        original_init(self, params, **kwargs)

    def split_with_params_on_device(self, offload_fraction):
        device_ids = {id(param) for group in self.param_groups for param in group["params"]}
        with _DeviceResidentMode(device_ids):
            return original_split(self, offload_fraction)

    HybridDeviceOptimizer.__init__ = init_without_pinned_memory
    HybridDeviceOptimizer._get_sub_optimizer_param_groups = split_with_params_on_device
    torch.cuda.current_stream = lambda device=None: _NullStream()
    torch.cuda.Stream = lambda *args, **kwargs: _NullStream()
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()


def offload_facts(optimizer: object) -> dict:
    """What the HybridDeviceOptimizer inside a (chained) Megatron optimizer really did: the
    share of parameter elements it moved to host copies and how many CPU sub-optimizers hold
    Adam state (empty until they stepped)."""
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    inners = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [])]
    inners = inners or [getattr(optimizer, "optimizer", None)]
    hybrids = [inner for inner in inners if isinstance(inner, HybridDeviceOptimizer)]
    if not hybrids:
        return {"hybrid": False, "offloaded_share": 0.0, "cpu_optimizers_with_state": 0}
    total = sum(p.numel() for h in hybrids for g in h.param_groups for p in g["params"])
    moved = sum(p.numel() for h in hybrids for p in h.gpu_params_map_cpu_copy)
    stepped = sum(1 for h in hybrids for cpu in h.cpu_optimizers if cpu.state)
    return {"hybrid": True, "offloaded_share": moved / total, "cpu_optimizers_with_state": stepped}
