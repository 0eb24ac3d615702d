"""Training checkpoints of the Megatron worker: save → load into a fresh worker (with parallel
reads) continues exactly like the run that saved, on 2 data-parallel ranks with the
distributed optimizer."""

from __future__ import annotations

import pytest

from tests.megatron import harness
from tests.megatron.test_parallel import converted  # noqa: F401  (module fixture)

# Spawns gloo ranks that build real megatron-core models: minutes on the 2-core machine.
pytestmark = pytest.mark.slow


def test_resume_continues_exactly(converted, tmp_path):  # noqa: F811
    hf_path, root = converted
    results = harness.run_ranks(
        2, harness.checkpoint_resume_run, hf_path, root, str(tmp_path / "train")
    )
    for result in results:
        continued = [s[key] for s in result["continued"] for key in ("loss", "grad_norm", "lr")]
        resumed = [s[key] for s in result["resumed"] for key in ("loss", "grad_norm", "lr")]
        assert resumed == pytest.approx(continued, rel=1e-6)
        # A fresh worker (no load) starts from the converted weights, not the trained ones.
        assert result["fresh_first_loss"] > continued[0] + 1e-3
        assert result["state"]["steps_done"] == 4
        # megatron's writer keeps a Manager process after a save; close() must stop it.
        assert result["helper_processes_left"] == []
