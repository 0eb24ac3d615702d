"""The Automodel backend's compiled log-prob and train passes compile once, in the first step,
and never again for the new lengths and batch shapes of later GRPO steps.

torch.compile runs only on GPUs in jobs; here the real ``AutomodelWorker`` (one gloo rank)
compiles its decoder blocks on CPU through a backend that counts compilations and runs the
captured graphs eagerly: what recompiles is decided by dynamo's guards, before any backend.
"""

from __future__ import annotations

import socket

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.core.backends.automodel.model import TokenLogprobModel  # noqa: E402
from hpcrl.core.backends.automodel.worker import AutomodelWorker  # noqa: E402
from hpcrl.core.backends.base import RankInfo  # noqa: E402
from hpcrl.core.workers.sharding import split_micro_batches  # noqa: E402
from tests.core.parallel_harness import make_batch, masked_nll_loss  # noqa: E402
from tests.recipe_builder import tiny_automodel_recipe  # noqa: E402


class CountingBackend:
    """A torch.compile backend that counts the graphs it is handed and runs them as is."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


@pytest.fixture
def compiled_worker(tiny_model_path):
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    backend = CountingBackend()
    worker_class = type(
        "CountingWorker", (AutomodelWorker,), {"compile_on_cpu": True, "compile_backend": backend}
    )
    worker = worker_class()
    info = RankInfo(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
        device="cpu",
    )
    torch._dynamo.reset()
    # the worker reports this process's graph count, which reset() leaves as it is: graphs
    # that earlier tests compiled (tests/core/test_fused_sampler.py) must not count here
    torch._dynamo.utils.counters.clear()
    worker.setup(tiny_automodel_recipe(micro_batch_size=2), info, tiny_model_path)
    try:
        yield worker, backend
    finally:
        worker.close()
        dist.destroy_process_group()
        torch._dynamo.reset()


def _grpo_like_batch(seed: int, rows: int, length: int, full: bool) -> dict:
    batch = make_batch(seed, batch_size=rows, seq_len=length)
    if full:  # every row as long as the batch: no padding at all
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    return batch


@pytest.mark.slow
def test_logprob_and_train_passes_compile_only_in_the_first_step(compiled_worker) -> None:
    worker, backend = compiled_worker
    eager = TokenLogprobModel(worker.model.hf)  # same weights, called outside compiled code
    steps = [(8, 37, False), (8, 53, False), (6, 71, False), (8, 64, True), (8, 120, False)]
    graphs_after_step = []
    for step, (rows, length, full) in enumerate(steps):
        batch = _grpo_like_batch(step, rows, length, full)
        logprobs = worker.logprobs(batch)
        assert logprobs.shape == (rows, length)
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            want, _ = eager(batch["input_ids"], batch["attention_mask"])
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(logprobs[real], want[real], atol=1e-5, rtol=0)
        micro = split_micro_batches(batch, 2)
        metrics = worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))
        assert metrics["loss"] > 0
        graphs_after_step.append(backend.graphs)
    assert graphs_after_step[0] > 0, "the blocks were compiled"
    assert graphs_after_step == [graphs_after_step[0]] * len(steps), graphs_after_step
    assert worker.collect_state()["compiled_graphs"] == graphs_after_step[0]


def test_sequence_padding_rounds_token_axes_up_to_the_bucket() -> None:
    from hpcrl.core.workers.sharding import pad_sequence_dim

    ones = torch.ones(2, 64, dtype=torch.long)
    batch = {"input_ids": ones, "attention_mask": ones, "advantages": torch.ones(2)}
    padded = pad_sequence_dim(batch, 64)
    assert padded["input_ids"].shape == (2, 64)  # a full bucket stays as it is
    assert torch.equal(padded["advantages"], batch["advantages"])
    short = pad_sequence_dim({"input_ids": ones[:, :37], "attention_mask": ones[:, :37]}, 64)
    assert short["input_ids"].shape == (2, 64)
    assert int(short["attention_mask"][:, 37:].sum()) == 0


def test_right_padding_is_told_from_other_layouts() -> None:
    from hpcrl.core.workers.sharding import is_right_padded

    right = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert is_right_padded(right)
    assert not is_right_padded(torch.tensor([[0, 1, 1, 1]]))  # left padding
    assert not is_right_padded(torch.tensor([[1, 0, 1, 0]]))  # a hole


def test_right_padded_rows_score_the_same_without_a_mask(tiny_model_path) -> None:
    """The backend drops the mask of right-padded micro-batches (causal attention alone);
    every real token's log-prob stays what the masked forward gives. A left-padded
    micro-batch keeps its mask."""
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs
    from hpcrl.core.backends.automodel.model import load_hf_model
    from hpcrl.core.backends.automodel.worker import AutomodelWorker

    root = TokenLogprobModel(load_hf_model(tiny_model_path, "cpu")).eval()
    batch = make_batch(3, batch_size=6, seq_len=41)
    assert AutomodelWorker._causal_only(batch)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        masked, _ = forward_logprobs(root, batch)
        unmasked, _ = forward_logprobs(root, batch, causal_only=True)
    torch.testing.assert_close(unmasked[real], masked[real], atol=1e-5, rtol=0)
    left = {key: value.flip(1) for key, value in batch.items() if value.dim() == 2}
    assert not AutomodelWorker._causal_only(left)


@pytest.mark.slow
def test_packed_and_dynamic_micro_batches_compile_only_in_the_first_step(compiled_worker) -> None:
    """Sequence packing and dynamic batching pick their own widths per micro-batch; they go
    through the same buckets, so later steps with new lengths build no new graph."""
    from hpcrl.core.workers.micro_batches import (
        BatchingSettings,
        materialize,
        plan_shards,
        row_lengths,
    )

    worker, backend = compiled_worker
    eager = TokenLogprobModel(worker.model.hf)
    packed = BatchingSettings(mode="packed", tokens_per_micro_batch=256, divisible_by=4)
    dynamic = BatchingSettings(mode="dynamic", tokens_per_micro_batch=256, round_to=16)
    # Packs of one sequence each: without a fill of their own their positions never restart.
    single = BatchingSettings(mode="packed", tokens_per_micro_batch=120)
    graphs_after_step = []
    for step, length in enumerate([37, 53, 71, 120]):
        batch = _grpo_like_batch(step, 8, length, full=False)
        lengths = row_lengths(batch)
        real = batch["attention_mask"].bool()
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            want, _ = eager(batch["input_ids"], batch["attention_mask"])
        for settings in (packed, dynamic, single):
            plan = plan_shards([lengths], length, settings)[0]
            logprobs = worker.logprobs(batch, plan)
            torch.testing.assert_close(logprobs[real], want[real], atol=1e-5, rtol=0)
        plan = plan_shards([lengths], length, packed)[0]
        micro = [materialize(batch, spec) for spec in plan]
        metrics = worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))
        assert metrics["loss"] > 0
        graphs_after_step.append(backend.graphs)
    assert graphs_after_step[0] > 0, "the blocks were compiled"
    assert graphs_after_step == [graphs_after_step[0]] * len(graphs_after_step), graphs_after_step


def test_every_decoder_block_runs_one_compiled_frame() -> None:
    """``apply_compile`` compiles each block, yet dynamo traces the blocks' shared code once:
    with nn-module inlining the weights are graph inputs, so a 4-block model is one frame
    and one graph, whatever the number of blocks (a warm run's trace costs one block)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcrl.core.backends.automodel.parallelize import apply_compile

    config = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 24))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    backend = CountingBackend()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        apply_compile(model, backend=backend)
        with torch.no_grad():
            got = model(ids, use_cache=False).logits
        frames = dict(torch._dynamo.utils.counters["frames"])
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert backend.graphs == 1
    assert frames == {"total": 1, "ok": 1}


def test_the_reference_pass_reuses_the_policys_log_prob_graph(compiled_worker) -> None:
    """The reference model's parameters keep ``requires_grad`` when compiled (its passes run
    under no_grad): a frozen copy failed the policy graph's guards and built a graph of its
    own in every run's first step. The shared graph still reads each model's own weights:
    after a train step the policy's log-probs move, the reference's do not."""
    worker, backend = compiled_worker
    batch = make_batch(0, batch_size=2, seq_len=24)
    initial = worker.logprobs(batch)
    graphs = backend.graphs
    assert graphs > 0, "the blocks were compiled"
    reference = worker.reference_logprobs(batch)
    assert backend.graphs == graphs, "the reference pass built a graph of its own"
    assert torch.equal(reference, initial)
    # built from the policy's weights in memory (no train step yet), equal to the
    # checkpoint build (tests/core/test_reference_from_policy.py: 2 ranks)
    assert worker.reference_source == "policy"
    for _ in range(3):
        worker.train_step([batch], masked_nll_loss, float(batch["token_mask"].sum()))
    trained = worker.logprobs(batch)
    after = worker.reference_logprobs(batch)
    real = batch["attention_mask"].bool()
    assert (trained[real] - initial[real]).abs().max() > 1e-3, "the policy trained"
    assert torch.equal(after, initial)
    assert not any(param.grad is not None for param in worker.reference.parameters())
    assert worker.collect_state()["compiled_graphs"] == backend.graphs
