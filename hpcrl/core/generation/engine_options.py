"""How ``TorchEngine`` runs (``EngineOptions``) and what one ``generate`` call did
(``GenerationStats``): shared by the engine (``torch_engine``) and its waves (``decode_wave``).
"""

from __future__ import annotations

import attrs

from hpcrl.core.generation.decode_launch import KernelLaunch
from hpcrl.core.generation.kv_cache import DecodeAttention


@attrs.frozen(kw_only=True)
class EngineOptions:
    """How the engine runs; the defaults are the fast path on each device."""

    cuda_graphs: bool = True  # CUDA only
    fuse_pointwise: bool = True  # CUDA only: torch.compile the norm / rotary / SiLU pieces
    # CUDA only, and only with fuse_pointwise (False there: nothing compiled at all):
    # torch.compile the sampler (sampling.fused_sampler)
    fuse_sampling: bool = True
    check_every_tokens: int = 16  # host looks at the finished count this often
    compact: bool = True
    max_rows: int | None = None  # None: as many as CACHE_MEMORY_FRACTION of free memory holds
    prefill_tokens_per_chunk: int = 16384  # padded tokens per prefill attention chunk
    # Decode attention reads the cache up to the next multiple of this: finer buckets read
    # fewer unused columns, at one more CUDA graph per bucket (captured once, when first met).
    column_bucket: int = 32
    # "bmm": two batched matmuls and the softmax; "sdpa": scaled_dot_product_attention;
    # "triton": rotary, the cache write and the attention in two Triton kernels
    # (triton_attention); "auto": "triton" on CUDA where it applies, else "bmm"
    decode_attention: DecodeAttention = "auto"
    # how the "triton" decode attention's kernel is launched (decode_launch.KernelLaunch);
    # None: by the decode step's rows (decode_launch.launch_for_rows)
    decode_launch: KernelLaunch | None = None


@attrs.define
class GenerationStats:
    """What one ``generate`` call did (also summed into ``lifetime``)."""

    waves: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    row_steps: int = 0  # sum over decode steps of the rows computed (the work done)
    compactions: int = 0
    graph_captures: int = 0
    generated_tokens: int = 0
    refits_in_flight: int = 0  # in-flight refits that landed between two decode steps
    recomputes: int = 0  # of those, the ones that prefilled the wave's cache again

    def as_metrics(self) -> dict[str, float]:
        return {
            "time_prefill_s": self.prefill_s,
            "time_decode_s": self.decode_s,
            "generation_waves": float(self.waves),
            "generation_decode_steps": float(self.decode_steps),
            "generation_row_steps": float(self.row_steps),
            "generation_compactions": float(self.compactions),
            "generation_graph_captures": float(self.graph_captures),
            "generation_refits_in_flight": float(self.refits_in_flight),
            "generation_kv_recomputes": float(self.recomputes),
        }
