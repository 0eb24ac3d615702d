"""Around generation the optimizer state leaves the GPU only for an engine that needs the room:
colocated vLLM on GPUs, not hpcrl's torch engine (its cache is sized once, from free memory,
and kept), and nothing on CPUs."""

from __future__ import annotations

import pytest

from hpcrl.core.generation.engine import EngineSpec
from hpcrl.core.workers.actor import TrainingWorker


class RecordingBackend:
    """Stand-in for a ``BackendWorker`` that only records the optimizer moves it is asked for
    (the real backends' moves act on GPU memory, which this machine lacks)."""

    def __init__(self) -> None:
        self.moves: list[str] = []

    def offload_optimizer(self) -> None:
        self.moves.append("offload")

    def onload_optimizer(self) -> None:
        self.moves.append("onload")


@pytest.mark.parametrize(
    ("engine", "device", "moves"),
    [
        ("torch", "cuda", False),
        ("vllm", "cuda", True),
        ("vllm", "cpu", False),
        ("torch", "cpu", False),
    ],  # fmt: skip
)
def test_optimizer_moves_only_for_engines_that_need_its_memory(engine, device, moves) -> None:
    spec = EngineSpec(
        backend=engine,
        model_path="model",
        tokenizer_path="model",
        device=device,
        precision="bfloat16",
        seed=0,
        max_model_len=64,
    )
    assert spec.needs_optimizer_memory is moves
    worker = TrainingWorker("unused.Backend")
    backend = RecordingBackend()
    worker._backend, worker._engine_spec = backend, spec  # what setup would have built
    worker.offload_optimizer()
    worker.onload_optimizer()
    assert backend.moves == (["offload", "onload"] if moves else [])
