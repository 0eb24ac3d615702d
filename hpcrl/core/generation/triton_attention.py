"""Decode attention in two Triton kernels: the new token's q and k rotated (rotary, when the
rows' cos/sin are given), its k/v written into the cache, its column marked visible, and one
query per row attending to the first ``width`` columns.

The eager path (``kv_cache.decode_attention``) runs seven kernels per layer: rotary, two
cache writes (``index_copy_``), the scores' batched matmul, the softmax (two kernels) and the
probabilities' batched matmul. Here (flash-decoding): one program per (row, kv head, block
of columns) rotates the new key, reads that block's keys and values once and, for each query
head of the group in turn (elementwise products in registers, no tensor-core tile),
rotates the query and leaves its softmax's max, sum and weighted values; a second kernel
per (row, head) combines the blocks. Small blocks with one warp keep many independent loads
in flight (``KernelLaunch``'s default; the per-query-head program, re-reading the block for
each head, is kept as ``kind="per_head"``). One program per (row, head) walking the columns
in a loop was slower than the eager kernels, and a grouped program with two tensor-core
products on a 16-row padded tile 5x slower at batch 256 (docs/performance.md, "Figures
behind the code"). The current column's k/v come from the kernel's inputs, not the cache,
so the programs that write them (the first column block's) race with nobody.

Numerics: the rotation in float32, rounded once to the input's dtype (what the compiled
``decoder.rotate_pair`` computes); scores, softmax and the weighted sum in float32, the
output rounded once to the cache's dtype (the eager path rounds the scores and probabilities
to bf16 as Hugging Face's eager attention does; the two agree to bf16 rounding). Checked
against the eager path on CPU through Triton's interpreter (``TRITON_INTERPRET=1``,
tests/core/test_triton_attention.py).

Imports Triton: import this module only where the kernel runs (``kv_cache`` does, lazily).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import triton
import triton.language as tl

from hpcrl.core.generation.decode_launch import KernelLaunch

if TYPE_CHECKING:
    import torch

__all__ = ["KernelLaunch", "decode_attention_triton"]


def _partial_kernel(
    q_ptr, k_new_ptr, v_new_ptr, cos_ptr, sin_ptr,
    keys_ptr, values_ptr, valid_ptr, column_ptr, ml_ptr, acc_ptr,
    width, scale,
    stride_qb, stride_qh,
    stride_kb, stride_kh,
    stride_vnb, stride_vnh,
    stride_rb,
    stride_cb, stride_ch, stride_cc,
    stride_vb,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr,
    ROTARY: tl.constexpr, READ_UNSEEN: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    kv = head // GROUP
    d = tl.arange(0, D)
    column = tl.load(column_ptr)
    k_at = k_new_ptr + row * stride_kb + kv * stride_kh
    q_at = q_ptr + row * stride_qb + head * stride_qh
    k_new = tl.load(k_at + d)
    q = tl.load(q_at + d).to(tl.float32)
    if ROTARY:
        # Hugging Face's rotate_half: x * cos + cat(-x[half:], x[:half]) * sin, in float32
        # and rounded once (what the compiled ``decoder.rotate_pair`` computes)
        partner = (d + D // 2) % D
        cos = tl.load(cos_ptr + row * stride_rb + d).to(tl.float32)
        sin = tl.load(sin_ptr + row * stride_rb + d).to(tl.float32)
        sin = tl.where(d < D // 2, -sin, sin)
        q_partner = tl.load(q_at + partner).to(tl.float32)
        q = (q * cos + q_partner * sin).to(q_ptr.dtype.element_ty).to(tl.float32)
        k_partner = tl.load(k_at + partner).to(tl.float32)
        k_new = (k_new.to(tl.float32) * cos + k_partner * sin).to(k_new_ptr.dtype.element_ty)
    v_new = tl.load(v_new_ptr + row * stride_vnb + kv * stride_vnh + d)
    cache_row = row * stride_cb + kv * stride_ch
    if split == 0 and head % GROUP == 0:
        tl.store(keys_ptr + cache_row + column * stride_cc + d, k_new)
        tl.store(values_ptr + cache_row + column * stride_cc + d, v_new)
        if head == 0:
            tl.store(valid_ptr + row * stride_vb + column, 1)
    cols = split * BLOCK + tl.arange(0, BLOCK)
    in_range = cols < width
    current = cols == column
    seen = tl.load(valid_ptr + row * stride_vb + cols, mask=in_range, other=0)
    visible = ((seen != 0) | current) & in_range
    # Only the cached columns the row sees are read: a left-padded row's leading columns and
    # the bucket's columns past the current one cost no memory traffic
    if READ_UNSEEN:
        cached = in_range & ~current
    else:
        cached = visible & ~current
    offsets = cache_row + cols[:, None] * stride_cc + d[None, :]
    keys = tl.load(keys_ptr + offsets, mask=cached[:, None], other=0.0)
    vals = tl.load(values_ptr + offsets, mask=cached[:, None], other=0.0)
    keys = tl.where(current[:, None], k_new[None, :], keys).to(tl.float32)
    scores = tl.sum(keys * q[None, :], axis=1) * scale
    # -3e38, not -inf: a block with nothing visible then weighs 0 instead of giving NaN
    scores = tl.where(visible, scores, -3.0e38)
    m = tl.max(scores, axis=0)
    p = tl.where(visible, tl.exp(scores - m), 0.0)
    vals = tl.where(current[:, None], v_new[None, :], vals).to(tl.float32)
    acc = tl.sum(p[:, None] * vals, axis=0)
    slot = (row * tl.num_programs(1) + head) * SPLITS + split
    tl.store(ml_ptr + slot * 2, m)
    tl.store(ml_ptr + slot * 2 + 1, tl.sum(p, axis=0))
    tl.store(acc_ptr + slot * D + d, acc)


def _grouped_partial_kernel(
    q_ptr, k_new_ptr, v_new_ptr, cos_ptr, sin_ptr,
    keys_ptr, values_ptr, valid_ptr, column_ptr, ml_ptr, acc_ptr,
    width, scale,
    stride_qb, stride_qh,
    stride_kb, stride_kh,
    stride_vnb, stride_vnh,
    stride_rb,
    stride_cb, stride_ch, stride_cc,
    stride_vb,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr,
    ROTARY: tl.constexpr, READ_UNSEEN: tl.constexpr,
):  # fmt: skip
    """``_partial_kernel`` with one program per (row, kv head, block) serving its whole query
    group from one load of the block's keys and values (the query heads in an unrolled loop
    of elementwise products; same numerics, same ``ml``/``acc`` slots)."""
    row = tl.program_id(0)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP
    d = tl.arange(0, D)
    column = tl.load(column_ptr)
    k_at = k_new_ptr + row * stride_kb + kv * stride_kh
    k_new = tl.load(k_at + d)
    partner = (d + D // 2) % D
    if ROTARY:
        cos = tl.load(cos_ptr + row * stride_rb + d).to(tl.float32)
        sin = tl.load(sin_ptr + row * stride_rb + d).to(tl.float32)
        sin = tl.where(d < D // 2, -sin, sin)
        k_partner = tl.load(k_at + partner).to(tl.float32)
        k_new = (k_new.to(tl.float32) * cos + k_partner * sin).to(k_new_ptr.dtype.element_ty)
    v_new = tl.load(v_new_ptr + row * stride_vnb + kv * stride_vnh + d)
    cache_row = row * stride_cb + kv * stride_ch
    if split == 0:
        tl.store(keys_ptr + cache_row + column * stride_cc + d, k_new)
        tl.store(values_ptr + cache_row + column * stride_cc + d, v_new)
        if kv == 0:
            tl.store(valid_ptr + row * stride_vb + column, 1)
    cols = split * BLOCK + tl.arange(0, BLOCK)
    in_range = cols < width
    current = cols == column
    seen = tl.load(valid_ptr + row * stride_vb + cols, mask=in_range, other=0)
    visible = ((seen != 0) | current) & in_range
    # Only the cached columns the row sees are read: a left-padded row's leading columns and
    # the bucket's columns past the current one cost no memory traffic
    if READ_UNSEEN:
        cached = in_range & ~current
    else:
        cached = visible & ~current
    offsets = cache_row + cols[:, None] * stride_cc + d[None, :]
    keys = tl.load(keys_ptr + offsets, mask=cached[:, None], other=0.0)
    vals = tl.load(values_ptr + offsets, mask=cached[:, None], other=0.0)
    keys = tl.where(current[:, None], k_new[None, :], keys).to(tl.float32)
    vals = tl.where(current[:, None], v_new[None, :], vals).to(tl.float32)
    for member in tl.static_range(GROUP):
        head = kv * GROUP + member
        q_at = q_ptr + row * stride_qb + head * stride_qh
        q = tl.load(q_at + d).to(tl.float32)
        if ROTARY:
            q_partner = tl.load(q_at + partner).to(tl.float32)
            q = (q * cos + q_partner * sin).to(q_ptr.dtype.element_ty).to(tl.float32)
        scores = tl.sum(keys * q[None, :], axis=1) * scale
        scores = tl.where(visible, scores, -3.0e38)
        m = tl.max(scores, axis=0)
        p = tl.where(visible, tl.exp(scores - m), 0.0)
        acc = tl.sum(p[:, None] * vals, axis=0)
        slot = (row * num_heads + head) * SPLITS + split
        tl.store(ml_ptr + slot * 2, m)
        tl.store(ml_ptr + slot * 2 + 1, tl.sum(p, axis=0))
        tl.store(acc_ptr + slot * D + d, acc)


def _dot_partial_kernel(
    q_ptr, k_new_ptr, v_new_ptr, cos_ptr, sin_ptr,
    keys_ptr, values_ptr, valid_ptr, column_ptr, ml_ptr, acc_ptr, out_ptr,
    width, scale, columns_per_split,
    stride_qb, stride_qh,
    stride_kb, stride_kh,
    stride_vnb, stride_vnh,
    stride_rb,
    stride_cb, stride_ch, stride_cc,
    stride_vb, stride_ob,
    GROUP: tl.constexpr, GROUP_TILE: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
    SPLITS: tl.constexpr, ROTARY: tl.constexpr, DIRECT: tl.constexpr, WIDE_DOT: tl.constexpr,
    READ_UNSEEN: tl.constexpr,
):  # fmt: skip
    """One program per (row, kv head, split) on the tensor cores: the query group as one
    [GROUP_TILE, D] tile (rows past the group are zeros), a loop over the split's columns
    BLOCK at a time with an online softmax, the scores and the weighted values each one
    ``tl.dot``. The new token's column is left out of the loop and added last from the
    kernel's inputs (no read of what the first split writes). ``DIRECT`` (one split): the
    normalised output is written here and no combine runs. ``WIDE_DOT``: the products in
    float32 from the same rounded inputs (float32 caches, where the tensor cores' default
    would round to tf32, and Triton's interpreter, whose bf16 ``tl.dot`` is wrong in Triton
    3.9): the same function as the bf16 products with float32 accumulation."""
    row = tl.program_id(0)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP
    d = tl.arange(0, D)
    member = tl.arange(0, GROUP_TILE)
    in_group = member < GROUP
    heads = kv * GROUP + member
    column = tl.load(column_ptr)
    k_at = k_new_ptr + row * stride_kb + kv * stride_kh
    k_new = tl.load(k_at + d)
    q_at = q_ptr + row * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_at + d[None, :], mask=in_group[:, None], other=0.0)
    if ROTARY:
        partner = (d + D // 2) % D
        cos = tl.load(cos_ptr + row * stride_rb + d).to(tl.float32)
        sin = tl.load(sin_ptr + row * stride_rb + d).to(tl.float32)
        sin = tl.where(d < D // 2, -sin, sin)
        k_partner = tl.load(k_at + partner).to(tl.float32)
        k_new = (k_new.to(tl.float32) * cos + k_partner * sin).to(k_new_ptr.dtype.element_ty)
        q_partner = tl.load(q_at + partner[None, :], mask=in_group[:, None], other=0.0)
        q = q.to(tl.float32) * cos[None, :] + q_partner.to(tl.float32) * sin[None, :]
        q = q.to(q_ptr.dtype.element_ty)
    v_new = tl.load(v_new_ptr + row * stride_vnb + kv * stride_vnh + d)
    cache_row = row * stride_cb + kv * stride_ch
    if split == 0:
        tl.store(keys_ptr + cache_row + column * stride_cc + d, k_new)
        tl.store(values_ptr + cache_row + column * stride_cc + d, v_new)
        if kv == 0:
            tl.store(valid_ptr + row * stride_vb + column, 1)
    start = split * columns_per_split
    stop = tl.minimum(start + columns_per_split, width)
    m = tl.full((GROUP_TILE,), -3.0e38, tl.float32)
    total = tl.zeros((GROUP_TILE,), tl.float32)
    acc = tl.zeros((GROUP_TILE, D), tl.float32)
    for first in range(start, stop, BLOCK):
        cols = first + tl.arange(0, BLOCK)
        in_range = cols < stop
        seen = tl.load(valid_ptr + row * stride_vb + cols, mask=in_range, other=0)
        visible = (seen != 0) & in_range & (cols != column)
        offsets = cache_row + cols[:, None] * stride_cc + d[None, :]
        if READ_UNSEEN:
            read = in_range
        else:
            read = visible
        keys = tl.load(keys_ptr + offsets, mask=read[:, None], other=0.0)
        vals = tl.load(values_ptr + offsets, mask=read[:, None], other=0.0)
        if WIDE_DOT:
            wide_q, wide_keys = q.to(tl.float32), keys.to(tl.float32)
            scores = tl.dot(wide_q, tl.trans(wide_keys), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(keys))
        scores = tl.where(visible[None, :], scores * scale, -3.0e38)
        m_next = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.where(visible[None, :], tl.exp(scores - m_next[:, None]), 0.0)
        rescale = tl.exp(m - m_next)
        total = total * rescale + tl.sum(p, axis=1)
        if WIDE_DOT:
            rounded_p = p.to(vals.dtype).to(tl.float32)
            weighted = tl.dot(rounded_p, vals.to(tl.float32), input_precision="ieee")
        else:
            weighted = tl.dot(p.to(vals.dtype), vals)
        acc = acc * rescale[:, None] + weighted
        m = m_next
    if (column >= start) & (column < stop):
        own = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1) * scale
        m_next = tl.maximum(m, own)
        rescale = tl.exp(m - m_next)
        p_own = tl.exp(own - m_next)
        total = total * rescale + p_own
        acc = acc * rescale[:, None] + p_own[:, None] * v_new.to(tl.float32)[None, :]
        m = m_next
    if DIRECT:
        out = acc / total[:, None]
        out_at = out_ptr + row * stride_ob + heads[:, None] * D + d[None, :]
        tl.store(out_at, out.to(out_ptr.dtype.element_ty), mask=in_group[:, None])
    else:
        slot = (row * num_heads + heads) * SPLITS + split
        tl.store(ml_ptr + slot * 2, m, mask=in_group)
        tl.store(ml_ptr + slot * 2 + 1, total, mask=in_group)
        tl.store(acc_ptr + slot[:, None] * D + d[None, :], acc, mask=in_group[:, None])


def _combine_kernel(
    ml_ptr, acc_ptr, out_ptr, splits, stride_ob,
    D: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, D)
    s = tl.arange(0, SPLITS)
    used = s < splits
    first = (row * tl.num_programs(1) + head) * SPLITS
    m = tl.load(ml_ptr + (first + s) * 2, mask=used, other=-3.0e38)
    l_part = tl.load(ml_ptr + (first + s) * 2 + 1, mask=used, other=0.0)
    acc = tl.load(acc_ptr + (first + s)[:, None] * D + d[None, :], mask=used[:, None], other=0.0)
    weight = tl.exp(m - tl.max(m, axis=0))
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.sum(weight * l_part, axis=0)
    tl.store(out_ptr + row * stride_ob + head * D + d, out.to(out_ptr.dtype.element_ty))


def _interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (what ``triton.jit`` reads)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _kernels() -> dict[str, Any]:
    """The jitted kernels, built on first use: ``triton.jit`` decides then whether they run
    compiled or in the interpreter (``TRITON_INTERPRET``)."""
    return {
        "per_head": triton.jit(_partial_kernel),
        "grouped": triton.jit(_grouped_partial_kernel),
        "dot": triton.jit(_dot_partial_kernel),
        "combine": triton.jit(_combine_kernel),
    }


def decode_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    column: torch.Tensor,
    width: int,
    scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    launch: KernelLaunch | None = None,
) -> torch.Tensor:
    """Write ``k``/``v`` [b, Hkv, D] at cache column ``column`` (a 1-element device tensor)
    of ``keys``/``values`` [b, Hkv, C, D], mark it in ``valid`` [b, C] (bool), and return
    the attention of ``q`` [b, H, D] over columns ``:width`` as [b, H*D]. ``rotary``: the
    rows' ``(cos, sin)`` [b, D]; given, ``q`` and ``k`` come in unrotated and the kernel
    rotates them (the cache receives the rotated keys). ``launch``: how the partial kernel
    runs (``benchmarks/decode_attention_kernels.py`` measures the choices; default
    ``KernelLaunch()``)."""
    import torch

    launch = launch or KernelLaunch()
    b, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
    assert keys.stride() == values.stride() and keys.stride(3) == 1
    assert head_dim & (head_dim - 1) == 0, "head_dim must be a power of two"
    cos, sin = rotary if rotary is not None else (q, q)
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    splits, columns_per_split = launch.splits(b, num_kv, width)
    padded_splits = triton.next_power_of_2(splits)
    kernels = _kernels()
    out = torch.empty((b, num_heads * head_dim), dtype=q.dtype, device=q.device)
    direct = launch.kind == "dot" and splits == 1
    slots = (b, num_heads, 1 if direct else padded_splits)
    ml = torch.empty((*slots, 2), dtype=torch.float32, device=q.device)
    acc = torch.empty((*slots, head_dim), dtype=torch.float32, device=q.device)
    group = num_heads // num_kv
    common = (
        q, k, v, cos, sin, keys, values, valid.view(torch.uint8), column, ml, acc,
    )  # fmt: skip
    strides = (
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), keys.stride(0), keys.stride(1), keys.stride(2), valid.stride(0),
    )  # fmt: skip
    tuning = {
        "num_warps": launch.num_warps, "num_stages": launch.num_stages,
        "READ_UNSEEN": launch.read_unseen,
    }  # fmt: skip
    if launch.kind == "dot":
        kernels["dot"][(b, num_kv, splits)](
            *common, out, width, scale, columns_per_split, *strides, out.stride(0),
            GROUP=group, GROUP_TILE=max(16, triton.next_power_of_2(group)), D=head_dim,
            BLOCK=launch.block_n, SPLITS=padded_splits, ROTARY=rotary is not None,
            DIRECT=direct, WIDE_DOT=q.dtype == torch.float32 or _interpreted(), **tuning,
        )  # fmt: skip
        if direct:
            return out
    else:
        programs_per_row = num_kv if launch.kind == "grouped" else num_heads
        kernels[launch.kind][(b, programs_per_row, splits)](
            *common, width, scale, *strides,
            GROUP=group, D=head_dim, BLOCK=launch.block_n, SPLITS=padded_splits,
            ROTARY=rotary is not None, **tuning,
        )  # fmt: skip
    kernels["combine"][(b, num_heads)](
        ml, acc, out, splits, out.stride(0), D=head_dim, SPLITS=padded_splits
    )  # fmt: skip
    return out
