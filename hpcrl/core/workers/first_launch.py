"""What a process's first GPU kernel launch pays once, paid in the worker's setup instead of
in the first GRPO step.

Triton hashes its own installed files (``triton_key``: every source file of the package read
and digested, 0.35 s on an H100 host) the first time a process looks a kernel up, whether its
compiled kernel comes from a cache or not: with every compilation loaded from the compile
cache, that was the first step's first kernel launch (docs/performance.md, item 3). The
answer is cached for the process (``functools.lru_cache`` in Triton), so paying it here
moves it out of step 1, not out of the job.
"""

from __future__ import annotations


def pay_triton_key() -> bool:
    """Compute Triton's per-process key (and Inductor's key of Triton with its backend) now,
    when a GPU is present; False when there is none or no Triton (nothing done). A failure
    costs nothing but the time it was meant to save: the first launch computes it again."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        from torch._inductor.runtime.triton_compat import HAS_TRITON, triton_key
    except ImportError:
        return False
    if not HAS_TRITON:
        return False
    triton_key()
    try:
        # the key of Triton with its CUDA backend (ptxas's version), cached per process too
        from torch.utils._triton import triton_hash_with_backend

        triton_hash_with_backend()
    except Exception:  # no such function in this torch, or no active driver
        pass
    return True
