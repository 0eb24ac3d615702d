"""A step's micro-batches onto the GPU in one copy.

``tensor.to("cuda", non_blocking=True)`` from ordinary (pageable) host memory is not
asynchronous: CUDA synchronises the stream before such a copy starts, so the host waits for
every kernel already queued, and the device then idles until the host has queued the next
micro-batch's first kernels. One copy per tensor per micro-batch drained the queue at every
micro-batch of a step. ``PinnedStaging`` lays every tensor of a step's micro-batches out in
one pinned host buffer, which it keeps and reuses (a fresh pinned allocation per step stalled
the host for up to 20 ms on an H100, docs/performance.md item 1, seventh session), and sends
it in one asynchronous copy; the micro-batches come back as views of that one device buffer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: each tensor starts at a multiple of this many bytes in the staging buffer, so the device
#: buffer's slices can be viewed as any dtype
ALIGNMENT_BYTES = 16


class PinnedStaging:
    """One worker's pinned staging buffer, grown to the largest upload seen, and the event
    of its last copy out (the buffer is refilled only after that copy has finished)."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.copied: Any = None  # torch.cuda.Event of the last copy out of the buffer

    def upload(
        self, micro_batches: Sequence[Mapping[str, torch.Tensor]], device: torch.device
    ) -> list[dict[str, torch.Tensor]]:
        """``micro_batches`` on ``device``. On a GPU, several micro-batches: every host
        tensor in one asynchronous copy out of the pinned buffer (a tensor already on a
        device is moved by itself). One micro-batch, or elsewhere: tensor by tensor. A step's
        single micro-batch is copied when the queue is empty anyway, and there the staging's
        host work cost more than it saved (~0.5 ms a step on an H100, docs/performance.md
        item 1, seventh session)."""
        if device.type != "cuda" or len(micro_batches) == 1:
            return [
                {key: value.to(device, non_blocking=True) for key, value in m.items()}
                for m in micro_batches
            ]
        import torch

        staged, total_bytes = _staged_layout(micro_batches)
        if self.copied is not None:
            self.copied.synchronize()  # long done in a step that read its loss back
        if self.buffer is None or self.buffer.numel() < total_bytes:
            size_bytes = max(total_bytes, 2 * self.buffer_bytes)  # few regrowths
            self.buffer = None  # released before its larger successor is pinned
            self.buffer = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=True)
        fill(self.buffer, staged)
        on_device = self.buffer[:total_bytes].to(device, non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        return views_of(micro_batches, staged, on_device)

    @property
    def buffer_bytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel()


def staged_bytes(
    micro_batches: Sequence[Mapping[str, torch.Tensor]],
) -> tuple[dict[tuple[int, str], tuple[torch.Tensor, int]], torch.Tensor]:
    """Every host tensor's bytes in one new (pageable) uint8 buffer, as ``PinnedStaging``
    lays them out in its pinned one."""
    import torch

    staged, total_bytes = _staged_layout(micro_batches)
    staging = torch.empty(total_bytes, dtype=torch.uint8)
    fill(staging, staged)
    return staged, staging


def fill(buffer: torch.Tensor, staged: Mapping[tuple[int, str], tuple[torch.Tensor, int]]) -> None:
    for tensor, offset in staged.values():
        buffer[offset : offset + _nbytes(tensor)].copy_(_as_bytes(tensor))


def views_of(
    micro_batches: Sequence[Mapping[str, torch.Tensor]],
    staged: Mapping[tuple[int, str], tuple[torch.Tensor, int]],
    buffer: torch.Tensor,
) -> list[dict[str, torch.Tensor]]:
    """The micro-batches as views of ``buffer`` (the staging buffer's copy on the device);
    a tensor that was not staged (already on a device) moves to ``buffer``'s device."""
    uploaded = []
    for index, micro in enumerate(micro_batches):
        out = {}
        for key, value in micro.items():
            if (index, key) not in staged:
                out[key] = value.to(buffer.device, non_blocking=True)
                continue
            tensor, offset = staged[index, key]
            piece = buffer[offset : offset + _nbytes(tensor)]
            out[key] = piece.view(tensor.dtype).view(tensor.shape)
        uploaded.append(out)
    return uploaded


def _staged_layout(
    micro_batches: Sequence[Mapping[str, torch.Tensor]],
) -> tuple[dict[tuple[int, str], tuple[torch.Tensor, int]], int]:
    """(micro-batch index, key) -> (contiguous host tensor, byte offset in the staging
    buffer) for every host tensor, and the buffer's size in bytes."""
    staged = {}
    offset = 0
    for index, micro in enumerate(micro_batches):
        for key, value in micro.items():
            if value.device.type != "cpu":
                continue
            tensor = value.contiguous()
            staged[index, key] = (tensor, offset)
            offset += -(-_nbytes(tensor) // ALIGNMENT_BYTES) * ALIGNMENT_BYTES
    return staged, max(offset, 1)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 view (bool and 0-d tensors included)."""
    import torch

    flat = tensor.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)
