"""``GlobalNorm``: the L2 norm of all of a step's gradients in one Triton launch per dtype.

Why: torch's ``_foreach_norm`` with a float32 result over bf16 gradients (the compute copies')
launches one reduction per tensor; for the 1.1B's 147 gradients that took 1.9 ms a step on an
H100 (docs/performance.md, issue 25 item 1), where reading 2.4 GB once takes ~0.7 ms. Here
every program sums the squares of one chunk of one gradient in float32 (a table, made once
per set of shapes, says which; the gradients' addresses change every step and travel in a
small pinned buffer), and torch sums the per-chunk partials: deterministic, and equal to the
per-tensor norms' norm to float32 rounding.

Imports Triton (kernels jitted at import; ``TRITON_INTERPRET=1`` runs them on CPU, as the
tests do): imported with ``master_adam``, where that is used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

#: Elements of one gradient a program sums; gradients smaller than it take one program.
CHUNK_NUMEL = 1 << 16
_TRITON_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


class GlobalNorm:
    """Callable: the float32 L2 norm (a device tensor) of contiguous gradients."""

    def __init__(self) -> None:
        # (device, dtype, sizes) -> on the device: the programs' table (tensor index, first
        # element) and the sizes
        self._tables: dict[tuple[str, torch.dtype, tuple[int, ...]], tuple[torch.Tensor, ...]] = {}
        # device -> (host buffer of addresses, the event after its last copy to the device)
        self._staging: dict[str, tuple[torch.Tensor, torch.cuda.Event | None]] = {}

    @staticmethod
    def takes(grads: Sequence[torch.Tensor]) -> bool:
        """Contiguous gradients of dtypes the kernel reads, on one device."""
        return (
            bool(grads)
            and len({g.device for g in grads}) == 1
            and all(g.is_contiguous() and g.dtype in _TRITON_DTYPES for g in grads)
        )

    def __call__(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        assert self.takes(grads), "GlobalNorm.takes says which gradients it reads"
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault(grad.dtype, []).append(grad)
        groups = list(by_dtype.values())
        # every group's addresses in one copy: a second copy through the same pinned buffer
        # would wait for the first, queued behind the whole backward (a host wait)
        addresses = self._addresses(
            [g.data_ptr() for group in groups for g in group], grads[0].device
        )
        partials, first = [], 0
        for group in groups:
            partials.append(self._squares(group, addresses[first : first + len(group)]))
            first += len(group)
        return torch.cat(partials).sum().sqrt()

    def _squares(self, grads: list[torch.Tensor], addresses: torch.Tensor) -> torch.Tensor:
        """Per-program float32 sums of squares of same-dtype ``grads`` (``addresses``: theirs,
        on the device)."""
        device = grads[0].device
        sizes = tuple(g.numel() for g in grads)
        key = (str(device), grads[0].dtype, sizes)
        if key not in self._tables:
            sizes_on_device = torch.tensor(sizes, dtype=torch.int64).to(device)
            self._tables[key] = (_program_table(sizes, device), sizes_on_device)
        programs, sizes_on_device = self._tables[key]
        partials = torch.empty(programs.shape[1], dtype=torch.float32, device=device)
        _squares_kernel[(programs.shape[1],)](
            addresses, sizes_on_device, programs, partials,
            DTYPE=_TRITON_DTYPES[grads[0].dtype], CHUNK=CHUNK_NUMEL, BLOCK=2048,
        )  # fmt: skip
        return partials

    def _addresses(self, pointers: list[int], device: torch.device) -> torch.Tensor:
        """The addresses as an int64 tensor on ``device``; on a GPU through a pinned buffer
        written only once its previous copy has run (no wait on the device's queue)."""
        if device.type != "cuda":
            return torch.tensor(pointers, dtype=torch.int64)
        key = str(device)
        staging, copied = self._staging.get(key, (None, None))
        if staging is None or staging.numel() < len(pointers):
            staging = torch.empty(max(len(pointers), 256), dtype=torch.int64, pin_memory=True)
        elif copied is not None:
            copied.synchronize()  # long done: the copy ran before the last call's kernels
        staging[: len(pointers)] = torch.tensor(pointers, dtype=torch.int64)
        on_device = staging[: len(pointers)].to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._staging[key] = (staging, event)
        return on_device


def _program_table(sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """[2, programs]: each program's tensor index and first element."""
    index, start = [], []
    for position, numel in enumerate(sizes):
        for first in range(0, numel, CHUNK_NUMEL):
            index.append(position)
            start.append(first)
    return torch.tensor([index, start], dtype=torch.int64).to(device)


@triton.jit
def _squares_kernel(
    addresses_ptr, sizes_ptr, programs_ptr, partials_ptr, DTYPE: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Program p: the float32 sum of squares of elements [first, first + CHUNK) of tensor t."""
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    tensor = tl.load(programs_ptr + program)
    first = tl.load(programs_ptr + programs + program)
    base = tl.load(addresses_ptr + tensor).to(tl.pointer_type(DTYPE))
    numel = tl.load(sizes_ptr + tensor)
    total = tl.zeros((BLOCK,), tl.float32)
    for offset in range(0, CHUNK, BLOCK):
        offsets = first + offset + tl.arange(0, BLOCK)
        values = tl.load(base + offsets, mask=offsets < numel, other=0.0).to(tl.float32)
        total += values * values
    tl.store(partials_ptr + program, tl.sum(total, axis=0))
