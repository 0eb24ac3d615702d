"""Small training-driver stand-ins for the bootstrap tests (the real driver is hpcrl.core.driver)."""

from __future__ import annotations

import ray


def exit_with_7(run_dir: str) -> int:
    """Fails like a training driver that hit an error: nonzero exit code, after touching Ray."""
    assert ray.is_initialized()
    print("driver: failing on purpose with exit code 7", flush=True)
    return 7


def checkpoint_on_preempt(run_dir: str) -> int:
    """Behaves like the training driver under preemption: it announces that it runs, waits for
    ``PREEMPT``, "saves a checkpoint" (a file) and returns 3; a resumed run finds the checkpoint
    and returns 0."""
    import time
    from pathlib import Path

    run = Path(run_dir)
    checkpoint = run / "checkpoint.txt"
    if checkpoint.exists():
        print(f"driver: resumed from {checkpoint.read_text()}", flush=True)
        return 0
    (run / "driver_started").write_text("yes")
    deadline = time.monotonic() + 120
    while not (run / "PREEMPT").exists():
        assert time.monotonic() < deadline, "no PREEMPT within 120 s"
        time.sleep(0.1)
    checkpoint.write_text("step 7")
    print("driver: saw PREEMPT, saved step 7", flush=True)
    return 3
