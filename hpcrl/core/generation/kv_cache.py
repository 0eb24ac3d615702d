"""The torch engine's device state: a static KV cache, per-row decode inputs, and the two
forwards of ``hpcrl.core.generation.decoder`` wired to them.

Everything is allocated once for a capacity of ``rows × columns`` and reused by every call
that fits, so captured CUDA graphs keep pointing at the same memory. Cache row ``s`` is a
*slot*: the engine maps slots to response rows and may move live rows to lower slots
(``compact``) when others finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from hpcrl.core.generation.decode_launch import KernelLaunch, launch_for_rows
from hpcrl.core.generation.decoder import masked_softmax

if TYPE_CHECKING:
    import torch

    from hpcrl.core.generation.decoder import Decoder

DecodeAttention = Literal["auto", "bmm", "sdpa", "triton"]

# Masked attention scores: finite, so rows with nothing visible stay NaN-free.
_MASKED_SCORE = -3.0e38
#: A prefill chunk's packed token count is padded up to a multiple of this. The compiled
#: pointwise pieces take that count as a dynamic size, and Triton specialises a kernel again
#: when an integer argument's divisibility by 16 changes. (Added for slow prefills at GRPO
#: steps 3-4, which turned out to be cuDNN's attention building a graph per new width: see
#: ``_padded_attention`` and docs/performance.md, "Figures behind the code".)
PREFILL_TOKEN_MULTIPLE = 64


def resolve_decode_attention(choice: DecodeAttention, decoder: Decoder) -> DecodeAttention:
    """``"auto"``: the Triton kernel on CUDA where it applies (head_dim a power of two), the
    batched matmuls elsewhere (on CPU Triton has only its interpreter). Measured faster at
    batch 64 and 256: docs/performance.md, issue 25 item 4."""
    if choice != "auto":
        return choice
    head_dim = decoder.shape.head_dim
    if decoder.device.type != "cuda" or head_dim & (head_dim - 1) != 0:
        return "bmm"
    import importlib.util

    return "triton" if importlib.util.find_spec("triton") is not None else "bmm"


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    softmax: Callable[..., torch.Tensor] = masked_softmax,
) -> torch.Tensor:
    """One query per row over ``l`` cached columns, grouped-query without repeating k/v.

    q [b, H, D]; k, v [b, Hkv, l, D] (views into the cache); bias [b, 1, 1, l] float32.
    Returns [b, H*D]. Softmax in float32, as Hugging Face's eager attention
    (``decoder.masked_softmax``; the engine passes its fused version on GPUs).
    """
    import torch

    b, num_heads, head_dim = q.shape
    num_kv, columns = k.shape[1], k.shape[2]
    group = num_heads // num_kv
    grouped_q = q.reshape(b * num_kv, group, head_dim)
    keys = k.reshape(b * num_kv, columns, head_dim)
    scores = torch.bmm(grouped_q, keys.transpose(1, 2))  # [b·Hkv, group, l]
    probs = softmax(scores, bias, scale)
    out = torch.bmm(probs, v.reshape(b * num_kv, columns, head_dim))
    return out.view(b, num_heads * head_dim)


def decode_attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """The same attention through ``scaled_dot_product_attention`` (one fused kernel where
    the device has one for a boolean mask); ``visible`` [b, 1, 1, l] bool. Returns [b, H*D]."""
    import torch.nn.functional as F

    b, num_heads, head_dim = q.shape
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k,
        v,
        attn_mask=visible,
        scale=scale,
        enable_gqa=num_heads != k.shape[1],
    )
    return out.reshape(b, num_heads * head_dim)


class DecodeState:
    """Cache, masks and per-slot inputs for up to ``rows`` slots and ``columns`` positions."""

    def __init__(
        self,
        decoder: Decoder,
        rows: int,
        columns: int,
        attention: DecodeAttention = "bmm",
        launch: KernelLaunch | None = None,
    ) -> None:
        import torch

        shape = decoder.shape
        device = decoder.device
        self.decoder, self.rows, self.columns = decoder, rows, columns
        self.attention = resolve_decode_attention(attention, decoder)
        self.launch = launch  # None: by the step's rows (launch_for_rows)
        self.cache = torch.zeros(
            (shape.num_layers, 2, rows, shape.num_kv_heads, columns, shape.head_dim),
            device=device,
            dtype=decoder.dtype,
        )
        self.valid = torch.zeros((rows, columns), device=device, dtype=torch.bool)
        self.tokens = torch.zeros(rows, device=device, dtype=torch.long)
        self.positions = torch.zeros(rows, device=device, dtype=torch.long)
        self.column = torch.zeros(1, device=device, dtype=torch.long)
        self.logits = torch.zeros((rows, shape.vocab), device=device, dtype=torch.float32)
        self.scale = shape.head_dim**-0.5
        decoder.ensure_rotary_tables(columns)

    @property
    def num_bytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.cache, self.valid, self.tokens, self.positions, self.logits)
        )

    # ------------------------------------------------------------------ decode
    def decode_forward(self, rows: int, columns: int) -> None:
        """Slots ``:rows`` consume ``tokens`` at ``positions``, write k/v at ``column`` and
        attend to cache columns ``:columns``; next-token logits land in ``logits[:rows]``. Fixed shapes,
        no host synchronisation: safe to capture as a CUDA graph."""
        import torch
        import torch.nn.functional as F

        decoder = self.decoder
        assert decoder.cos is not None and decoder.sin is not None
        b, width = rows, columns
        positions = self.positions[:b]
        hidden = F.embedding(self.tokens[:b], decoder.embed)
        cos = decoder.cos.index_select(0, positions)[:, None]
        sin = decoder.sin.index_select(0, positions)[:, None]
        valid = self.valid[:b]
        if self.attention == "triton":
            # rotary inside the attention kernel: one kernel a layer fewer
            triton_attend = self._triton_attend(b, width, (cos[:, 0], sin[:, 0]))
            normed = decoder.forward_rows(hidden, None, None, triton_attend)
            decoder.logits_into(normed, self.logits[:b])
            return
        valid.index_fill_(1, self.column, True)
        visible = valid[:, :width].view(b, 1, 1, width)
        sdpa = self.attention == "sdpa"
        bias = None if sdpa else torch.where(visible, 0.0, _MASKED_SCORE)
        softmax = decoder.pointwise.masked_softmax

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = self.cache[layer, 0, :b], self.cache[layer, 1, :b]
            keys.index_copy_(2, self.column, k.unsqueeze(2))
            values.index_copy_(2, self.column, v.unsqueeze(2))
            keys, values = keys[:, :, :width], values[:, :, :width]
            if bias is None:
                return decode_attention_sdpa(q, keys, values, visible, self.scale)
            return decode_attention(q, keys, values, bias, self.scale, softmax)

        normed = decoder.forward_rows(hidden, cos, sin, attend)
        decoder.logits_into(normed, self.logits[:b])

    def _triton_attend(
        self, rows: int, width: int, rotary: tuple[torch.Tensor, torch.Tensor]
    ) -> Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """The decode step's attention as two Triton kernels per layer (rotary, cache
        write, visible column and attention together, then the blocks' combine:
        ``triton_attention``); q and k come in unrotated."""
        from hpcrl.core.generation.triton_attention import decode_attention_triton

        valid = self.valid[:rows]
        launch = self.launch or launch_for_rows(rows)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = self.cache[layer, 0, :rows], self.cache[layer, 1, :rows]
            return decode_attention_triton(
                q, k, v, keys, values, valid, self.column, width, self.scale, rotary, launch
            )

        return attend

    # ------------------------------------------------------------------ prefill
    def prefill(self, prompts: Sequence[Sequence[int]], end_column: int, tokens_per_chunk: int):
        """Slots ``0..len(prompts)-1`` get their prompt (longest first expected), ending at
        ``end_column``; sets their positions, masks and first-token logits."""
        self.valid[: len(prompts)].zero_()
        start = 0
        while start < len(prompts):
            width = len(prompts[start])
            count = max(1, min(len(prompts) - start, tokens_per_chunk // max(width, 1)))
            self._prefill_chunk(prompts[start : start + count], start, end_column)
            start += count

    def _prefill_chunk(self, prompts: Sequence[Sequence[int]], first_slot: int, end: int):
        import torch

        decoder, device = self.decoder, self.decoder.device
        assert decoder.cos is not None and decoder.sin is not None
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        flat = [token for prompt in prompts for token in prompt]
        local_slot = [s for s, n in enumerate(lengths) for _ in range(n)]
        local_col = [width - n + t for n in lengths for t in range(n)]
        position = [t for n in lengths for t in range(n)]
        as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        real = len(flat)
        # Pad tokens (id 0 at position 0) only pass through the per-token pieces: attention
        # and the cache see the real ones, and the logits read real rows only.
        pad = [0] * (-real % PREFILL_TOKEN_MULTIPLE)
        ids, slots, cols, pos = map(as_tensor, (flat + pad, local_slot, local_col, position + pad))
        key_valid = (
            torch.arange(width, device=device)[None] >= (width - as_tensor(lengths))[:, None]
        )
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        mask = (causal[None] & key_valid[:, None, :]) | torch.eye(
            width, dtype=torch.bool, device=device
        )
        rows = slice(first_slot, first_slot + len(prompts))
        window = slice(end - width, end)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = self.cache[layer, 0], self.cache[layer, 1]
            keys[slots + first_slot, :, cols + window.start] = k[:real]
            values[slots + first_slot, :, cols + window.start] = v[:real]
            out = _padded_attention(
                q[:real], keys[rows, :, window], values[rows, :, window], mask, slots, cols
            )
            return torch.nn.functional.pad(out, (0, 0, 0, len(pad)))

        hidden = decoder.embed[ids]
        cos, sin = decoder.cos[pos][:, None], decoder.sin[pos][:, None]
        normed = decoder.forward_rows(hidden, cos, sin, attend)
        last = torch.cumsum(as_tensor(lengths), dim=0) - 1
        self.logits[rows].copy_(decoder.logits(normed[last]))
        self.valid[rows, window] = key_valid
        self.positions[rows] = as_tensor(lengths)

    # ------------------------------------------------------------------ compaction
    def compact(self, keep_slots: torch.Tensor, columns: int) -> None:
        """Move slots ``keep_slots`` (in order) to slots ``0..len-1``; columns ``:columns``."""
        count = keep_slots.shape[0]
        moved = self.cache[:, :, :, :, :columns].index_select(2, keep_slots)
        self.cache[:, :, :count, :, :columns].copy_(moved)
        for buffer in (self.valid, self.tokens, self.positions, self.logits):
            buffer[:count].copy_(buffer.index_select(0, keep_slots))


def _padded_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    slots: torch.Tensor,
    cols: torch.Tensor,
) -> torch.Tensor:
    """Packed queries [n, H, D] over one chunk's padded window of the cache; [n, H*D]."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    no_cudnn = [
        SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH
    ]  # fmt: skip
    rows, num_kv, width, head_dim = keys.shape
    num_heads = q.shape[1]
    group = num_heads // num_kv
    if group > 1:
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
    padded_q = torch.zeros((rows, num_heads, width, head_dim), dtype=q.dtype, device=q.device)
    padded_q[slots, :, cols] = q
    # Not cuDNN's attention: it builds a graph per shape (hundreds of ms), and every GRPO
    # step prefills at a new prompt width (benchmarks/prefill_attention_shapes.py).
    with sdpa_kernel(no_cudnn):
        out = F.scaled_dot_product_attention(padded_q, keys, values, attn_mask=mask[:, None])
    return out[slots, :, cols].reshape(q.shape[0], num_heads * head_dim)
