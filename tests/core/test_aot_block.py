"""The Automodel worker's decoder block compiled ahead of time (``aot_block``): a second
process with the same planned compile cache loads the block's forward and backward and
dynamo traces nothing, with log-probs and a train step equal to the ordinary compiled path.

Each run is a fresh interpreter with the real ``AutomodelWorker`` compiling its blocks with
Inductor on CPU (``compile_on_cpu``): a log-prob pass (no_grad), one train step (forward and
backward with gradients), a log-prob pass after it (what the gradients did).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.require import require_module

REPO = Path(__file__).resolve().parents[2]
ONE_RUN = """
import json, os, socket, sys
import torch
import torch.distributed as dist
from hpcrl.core.backends.automodel.worker import AutomodelWorker
from hpcrl.core.backends.base import RankInfo
from tests.core.parallel_harness import make_batch, masked_nll_loss
from tests.recipe_builder import tiny_automodel_recipe
from hpcrl.core.backends.automodel.parallelize import decoder_layers

torch.set_num_threads(1)
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
worker = type("CompilingWorker", (AutomodelWorker,), {"compile_on_cpu": True})()
info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                master_addr="127.0.0.1", master_port=port, device="cpu")
worker.setup(tiny_automodel_recipe(micro_batch_size=2), info, sys.argv[1])
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
print(json.dumps({
    "frames": counters["frames"]["total"], "graphs": counters["stats"]["unique_graphs"],
    "first": first.tolist(), "reference": reference.tolist(), "after": after.tolist(), "loss": float(metrics["loss"]),
    "loads": aot.loads if aot else None, "builds": aot.builds if aot else None,
    "failures": aot.failures if aot else None, "shared": shared,
}), flush=True)
os._exit(0)  # gloo's threads may abort a normal interpreter exit (shared/notes)
"""


def one_run(model: str, env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", ONE_RUN, model], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


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
