"""Small training-driver stand-ins for the bootstrap tests (the real driver is hpcrl.core.driver)."""

from __future__ import annotations

import ray


def exit_with_7(run_dir: str) -> int:
    """Fails like a training driver that hit an error: nonzero exit code, after touching Ray."""
    assert ray.is_initialized()
    print("driver: failing on purpose with exit code 7", flush=True)
    return 7
