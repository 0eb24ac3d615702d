"""The Automodel worker's decoder block compiled ahead of time (``aot_block``): a second
process with the same planned compile cache loads the block's forward and backward and
dynamo traces nothing, with log-probs and a train step equal to the ordinary compiled path.

Each run is a fresh interpreter with the real ``AutomodelWorker`` compiling its blocks with
Inductor on CPU (``compile_on_cpu``): a log-prob pass (no_grad), one train step (forward and
backward with gradients), a log-prob pass after it (what the gradients did).
"""

from __future__ import annotations

import pytest

from tests.core.compiling_worker import run_child
from tests.require import require_module

ONE_RUN = """
import sys
import torch
from hpcrl.core.backends.automodel.parallelize import decoder_layers
from tests.core.compiling_worker import compiling_worker, report_and_exit
from tests.core.parallel_harness import make_batch, masked_nll_loss

worker = compiling_worker(sys.argv[1])
kept = worker.block_compilations.pieces
preloaded = kept.loads if kept else None  # by the worker's setup, before any call
rng = torch.rand(3).tolist()  # the first calls in setup leave the random streams as they were
counters = torch._dynamo.utils.counters
first = worker.logprobs(make_batch(0, batch_size=2, seq_len=100))
reference = worker.reference_logprobs(make_batch(0, batch_size=2, seq_len=100))
batch = make_batch(1, batch_size=2, seq_len=110)
metrics = worker.train_step([batch], masked_nll_loss, float(batch["token_mask"].sum()))
after = worker.logprobs(make_batch(0, batch_size=2, seq_len=100))
blocks = [layer._compiled_call_impl for layer in decoder_layers(worker.model.hf)]
aot = getattr(blocks[0], "precompiled", None)
reference_block = decoder_layers(worker.reference.hf)[0]._compiled_call_impl
shared = getattr(reference_block, "precompiled", None) is aot
report_and_exit({
    "frames": counters["frames"]["total"], "graphs": counters["stats"]["unique_graphs"],
    "first": first.tolist(), "reference": reference.tolist(), "after": after.tolist(), "loss": float(metrics["loss"]),
    "loads": aot.loads if aot else None, "builds": aot.builds if aot else None,
    "failures": aot.failures if aot else None, "shared": shared, "preloaded": preloaded,
    "rejections": aot.rejections if aot else None, "rng": rng,
    "first_calls_s": worker.first_calls_s,
    "kept_shapes": sorted(worker.block_compilations.kept_call_shapes().items()),
})
"""


def one_run(model: str, env: dict[str, str]) -> dict:
    return run_child(ONE_RUN, model, env, timeout_s=900)


@pytest.mark.slow  # Inductor's C++ kernels compile for minutes on the 2-core CI box
def test_a_warm_run_loads_the_blocks_forward_and_backward_tracing_nothing(tmp_path):
    require_module("torch")
    import torch

    from hpcrl.core.models.tiny import ensure_tiny_model

    model = ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path / "models"))
    cache = str(tmp_path / "inductor")
    # No planned cache (the variable hpcrl's job script sets is absent): today's path.
    plain = one_run(model, {"TORCHINDUCTOR_CACHE_DIR": cache})
    assert plain["loads"] is None and plain["frames"] > 0
    planned = {"TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    cold = one_run(model, planned)
    assert cold["failures"] == [] and cold["builds"] == 2 and cold["loads"] == 0, cold
    warm = one_run(model, planned)
    # 2 files (no_grad, grad) loaded once: the reference model's blocks share them
    assert warm["shared"] and cold["shared"]
    assert warm["failures"] == [] and warm["loads"] == 2 and warm["builds"] == 0, warm
    # both loaded in the worker's setup, none at a first call, and every call taken
    assert warm["preloaded"] == 2 and warm["rejections"] == [], warm
    assert cold["preloaded"] == 0 and cold["rejections"] == [], cold
    assert warm["frames"] == 0 and warm["graphs"] == 0, warm
    # the kept compilations' first calls were made in setup, in the warm run only
    assert warm["first_calls_s"] is not None and warm["first_calls_s"] > 0
    assert plain["first_calls_s"] is None and cold["first_calls_s"] is None
    # ... with the shapes of the cold run's calls that built them (padded to 64 columns)
    assert warm["kept_shapes"] == [[False, [2, 128]], [True, [2, 128]]], warm["kept_shapes"]
    assert warm["rng"] == plain["rng"] == cold["rng"]
    for run in (cold, warm):
        for key in ("first", "reference", "after"):
            torch.testing.assert_close(
                torch.tensor(run[key]), torch.tensor(plain[key]), atol=1e-5, rtol=0
            )
        assert run["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    # the train step moved the weights: equal "after" log-probs mean equal gradients (the
    # warm run's first calls in setup left none behind)
    assert (torch.tensor(plain["after"]) - torch.tensor(plain["first"])).abs().max() > 1e-4


def test_a_call_no_compilation_takes_computes_its_signature_once_per_kind(monkeypatch, tmp_path):
    """The fallback path (here every kind of call's build failed in an earlier run: its
    ``.failed`` file): each block computes a kind of call's signature once, not in every call
    (the block's repr and the arguments' pytree: ~57 us a call), and a kind of its own for
    each grad mode, train mode and kind of arguments. No compilation: blocks run eager."""
    torch = require_module("torch")
    from hpcrl.core.backends.automodel import aot_block

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, hidden, mask=None, scale=1.0):
            out = self.linear(hidden) * scale
            return out if mask is None else out * mask

    computed = []
    signature_of = aot_block.block_signature

    def counted(call):
        computed.append(call)
        return signature_of(call)

    monkeypatch.setattr(aot_block, "block_signature", counted)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    precompiled = aot_block.precompiled_blocks("inductor")
    assert precompiled is not None
    hidden, mask = torch.randn(2, 3, 8), torch.ones(2, 3, 1)
    kinds = [(False, False, {}), (False, False, {"mask": mask}), (True, True, {})]
    kinds.append((False, False, {"scale": 2.0}))  # (grad mode, train mode, keyword arguments)
    blocks = [Block(), Block()]
    signatures = set()
    for grad, train, kwargs in kinds:
        with torch.set_grad_enabled(grad):
            signature = signature_of((blocks[0].train(train), (hidden,), kwargs))
        signatures.add(signature)
        refused = precompiled.path_for(signature).with_suffix(".failed")
        refused.parent.mkdir(parents=True, exist_ok=True)
        refused.write_text("RuntimeError: a build that failed in an earlier run")
    calls = [aot_block.AheadOfTimeBlockCall(b, precompiled, b._call_impl) for b in blocks]
    for _ in range(3):
        for block, call in zip(blocks, calls, strict=True):
            for grad, train, kwargs in kinds:
                block.train(train)
                with torch.set_grad_enabled(grad):
                    got = call(hidden, **kwargs)
                    torch.testing.assert_close(got, block(hidden, **kwargs), rtol=0, atol=0)
    assert len(computed) == len(blocks) * len(kinds)  # not once in each of the 24 calls
    assert len(signatures) == len(kinds) and precompiled.signatures_tried == signatures
    assert len(precompiled.failures) == len(kinds)  # each kind tried once, then the fallback
