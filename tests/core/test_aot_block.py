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
counters = torch._dynamo.utils.counters
first = worker.logprobs(make_batch(0, batch_size=2, seq_len=24))
reference = worker.reference_logprobs(make_batch(0, batch_size=2, seq_len=24))
batch = make_batch(1, batch_size=2, seq_len=31)
metrics = worker.train_step([batch], masked_nll_loss, float(batch["token_mask"].sum()))
after = worker.logprobs(make_batch(0, batch_size=2, seq_len=24))
blocks = [layer._compiled_call_impl for layer in decoder_layers(worker.model.hf)]
aot = getattr(blocks[0], "precompiled", None)
reference_block = decoder_layers(worker.reference.hf)[0]._compiled_call_impl
shared = getattr(reference_block, "precompiled", None) is aot
report_and_exit({
    "frames": counters["frames"]["total"], "graphs": counters["stats"]["unique_graphs"],
    "first": first.tolist(), "reference": reference.tolist(), "after": after.tolist(), "loss": float(metrics["loss"]),
    "loads": aot.loads if aot else None, "builds": aot.builds if aot else None,
    "failures": aot.failures if aot else None, "shared": shared,
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
    assert warm["frames"] == 0 and warm["graphs"] == 0, warm
    for run in (cold, warm):
        for key in ("first", "reference", "after"):
            torch.testing.assert_close(
                torch.tensor(run[key]), torch.tensor(plain[key]), atol=1e-5, rtol=0
            )
        assert run["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    # the train step moved the weights: equal "after" log-probs mean equal gradients
    assert (torch.tensor(plain["after"]) - torch.tensor(plain["first"])).abs().max() > 1e-4
