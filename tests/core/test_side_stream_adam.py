"""``SideStreamAdam`` (``hpcrl.core.backends.automodel.side_stream_adam``): the optimizer step
queued on a stream of its own trains exactly as the step on one stream, and every forward
waits for a stage's update before it uses that stage's weights.

CUDA streams exist only on a GPU: on the CPU the checks hand ``SideStreamAdam`` a stand-in for
``torch.cuda`` (``RecordedStreams``) that runs every launch at once and logs the stream calls
(what waits for what, in which order); ``check_same_training_on_a_side_stream("cuda")`` runs
the same training on a GPU with real streams, where a missing wait reads weights mid-update
(run there by ``benchmarks/gpu_issue25.sh``'s `train` piece beside the row
``backend-adam-inline``, whose losses must equal the product row's).
"""

from __future__ import annotations

import contextlib
import copy
import time

from tests.require import require_module
from tests.triton_interpreter import run_interpreted

torch = require_module("torch")
require_module("triton")
require_module("transformers")

MAX_NORM = 0.05


class RecordedStreams:
    """A stand-in for ``torch.cuda``'s stream calls on the CPU: work runs when it is queued,
    and ``log`` keeps ``(call, stream, event)`` in call order. Events are numbered in the
    order they were recorded. Timing events log ``("timing", stream, number)``, keep the host
    clock at their record, and count as finished (``query``) while ``finished`` is True."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, int | None]] = []
        self._current = "main"
        self._events = 0
        self._streams = 0
        self.finished = True

    def Event(self, enable_timing: bool = False) -> _TimingEvent:  # noqa: N802 - torch.cuda's
        assert enable_timing
        return _TimingEvent(self)

    def Stream(self) -> _Stream:  # noqa: N802 - torch.cuda's name
        self._streams += 1
        return _Stream(self, f"side{self._streams}")

    def current_stream(self) -> _Stream:
        return _Stream(self, self._current)

    @contextlib.contextmanager
    def stream(self, stream: _Stream):
        before, self._current = self._current, stream.name
        try:
            yield
        finally:
            self._current = before

    def next_event(self) -> int:
        self._events += 1
        return self._events


class _Stream:
    def __init__(self, streams: RecordedStreams, name: str) -> None:
        self.streams, self.name = streams, name

    def wait_stream(self, other: _Stream) -> None:
        self.streams.log.append(("wait_stream", self.name, None))

    def record_event(self) -> int:
        event = self.streams.next_event()
        self.streams.log.append(("record", self.name, event))
        return event

    def wait_event(self, event: int) -> None:
        self.streams.log.append(("wait_event", self.name, event))


class _TimingEvent:
    def __init__(self, streams: RecordedStreams) -> None:
        self.streams = streams
        self.recorded_at_s: float | None = None

    def record(self) -> None:
        self.recorded_at_s = time.perf_counter()
        self.streams.log.append(("timing", self.streams._current, self.streams.next_event()))

    def query(self) -> bool:
        return self.streams.finished

    def elapsed_time(self, end: _TimingEvent) -> float:
        assert self.recorded_at_s is not None and end.recorded_at_s is not None
        return (end.recorded_at_s - self.recorded_at_s) * 1e3


def _tiny_root():
    from tests.core.test_master_weights import tiny_root

    return tiny_root()


def _optimizer(root):
    from hpcrl.core.backends.automodel.master_adam import MasterWeightAdam
    from hpcrl.core.backends.automodel.master_weights import apply_compute_copies

    copies = apply_compute_copies(root.hf, torch.bfloat16)
    root.compute_copies = copies
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    return MasterWeightAdam(list(root.parameters()), copies, decoupled_weight_decay=True, **kwargs)


def _steps(root, optimizer, step, settle, batches, count: int) -> list[float]:
    """The worker's order: forward, settle, backward per micro-batch; clip; step; zero_grad."""
    losses = []
    for _ in range(count):
        total = 0.0
        for ids in batches:
            logprobs, _ = root(ids, None)
            settle()
            loss = -logprobs[:, 1:].mean() / len(batches)
            loss.backward()
            total += float(loss.detach())
        optimizer.clip_before_step(MAX_NORM)
        step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


def check_same_training_on_a_side_stream(device: str = "cpu") -> None:
    """Three steps of two micro-batches: the same losses, weights, copies and moments to the
    bit as the step on one stream. On the CPU, also the order of the stream calls."""
    from hpcrl.core.backends.automodel.side_stream_adam import SideStreamAdam

    reference = _tiny_root().to(device)
    root = copy.deepcopy(reference)
    ref_optimizer, optimizer = _optimizer(reference), _optimizer(root)
    streams = RecordedStreams() if device == "cpu" else None
    overlapped = SideStreamAdam(optimizer, root, streams=streams)
    if streams is not None:
        _check_forward_waits(root, overlapped, streams)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 96, (2, 12), generator=gen).to(device) for _ in range(2)]

    want = _steps(reference, ref_optimizer, ref_optimizer.step, lambda: None, batches, 3)
    got = _steps(root, optimizer, overlapped.step, overlapped.settle, batches, 3)
    overlapped.settle()

    assert want[-1] < want[0], want  # it trains
    assert got == want
    for (name, mine), theirs in zip(root.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs), name
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[mine][key], ref_optimizer.state[theirs][key])
    for (_, compute), (_, ref_compute) in zip(
        optimizer.copies.pairs, ref_optimizer.copies.pairs, strict=True
    ):
        assert torch.equal(compute, ref_compute)
    if streams is not None:
        _check_step_order(overlapped, streams)
        _check_update_seconds(root, optimizer, overlapped, streams, batches)
    else:  # real CUDA events: three finished updates, taken once
        torch.cuda.synchronize()
        assert overlapped.take_update_seconds() > 0
        assert overlapped.take_update_seconds() == 0


def _check_forward_waits(root, overlapped, streams: RecordedStreams) -> None:
    """Logs each decoder block's run after the waits (hooks run in the order registered)."""
    for index, layer in enumerate(root.hf.model.layers, start=1):
        layer.register_forward_pre_hook(
            lambda _m, _a, stage=index: streams.log.append(("block", "main", stage))
        )
    # stage 0 (embedding, final norm), one stage per block, the head: in forward order
    layers = list(root.hf.model.layers)
    assert [len(stage) for stage in overlapped.stages] == [2, 9, 9, 1]
    assert all(p in set(layers[0].parameters()) for p in overlapped.stages[1])
    assert overlapped.stages[3] == [root.hf.lm_head.weight]


def _check_step_order(overlapped, streams: RecordedStreams) -> None:
    """Per step: the side stream waits for the gradients, records one event per stage after
    its launches; the next forward's main stream waits for stage 0 first, then for block i's
    event just before block i runs; the worker's settle after that forward waits once more
    for the whole side stream."""
    log = streams.log
    first = log.index(("wait_stream", "side1", None))  # the first step's queue
    records = [entry for entry in log[first:] if entry[0] == "record"][:4]
    assert [entry[1] for entry in records] == ["side1"] * 4
    events = [entry[2] for entry in records]
    after = log[log.index(records[-1]) + 1 :]
    waits = [entry for entry in after if entry[0] in ("wait_event", "block")]
    assert waits[:6] == [
        ("wait_event", "main", events[0]),
        ("wait_event", "main", events[1]),
        ("block", "main", 1),
        ("wait_event", "main", events[2]),
        ("block", "main", 2),
        ("wait_event", "main", events[3]),  # the decoder returned: the head comes next
    ], waits[:6]
    settle = after.index(("wait_stream", "main", None))
    assert settle > after.index(("wait_event", "main", events[3]))
    assert overlapped._read == [] and overlapped._pending == [None] * 4


def _check_update_seconds(root, optimizer, overlapped, streams, batches) -> None:
    """Each update is timed on the side stream around its stages; what is taken is what the
    device finished, once: an update still running counts at the next take."""
    log = streams.log
    first = log.index(("wait_stream", "side1", None))
    on_side = [entry[0] for entry in log[first:] if entry[1] == "side1"][:7]
    assert on_side == ["wait_stream", "timing", "record", "record", "record", "record", "timing"]
    assert overlapped.take_update_seconds() > 0  # three updates, all finished
    assert overlapped.take_update_seconds() == 0
    streams.finished = False
    _steps(root, optimizer, overlapped.step, overlapped.settle, batches, 1)
    assert overlapped.take_update_seconds() == 0
    streams.finished = True
    assert overlapped.take_update_seconds() > 0
    assert overlapped.take_update_seconds() == 0


def check_compiled_blocks_wait_outside_their_graph() -> None:
    """A compiled block (``Module.compile``, as ``parallelize.apply_compile``) gets its wait
    in front of the compiled call, not inside the graph: the wait runs on every call and the
    block compiles once; ``remove`` puts the compiled call back."""
    from hpcrl.core.backends.automodel.side_stream_adam import wait_before_call

    class Block(torch.nn.Module):  # torch's own modules alone are not compiled
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.linear(x))

    layer = Block()
    compiled_frames = []

    def backend(graph, _inputs):
        compiled_frames.append(graph)
        return graph.forward

    layer.compile(backend=backend)
    waits = []
    handle = wait_before_call(layer, lambda: waits.append(1))
    for _ in range(3):
        layer(torch.ones(2, 4))
    assert len(waits) == 3 and len(compiled_frames) == 1
    handle.remove()
    layer(torch.ones(2, 4))
    assert len(waits) == 3 and len(compiled_frames) == 1


def test_the_side_stream_trains_to_the_bit_as_one_stream_and_waits_per_block():
    run_interpreted(__name__, "check_same_training_on_a_side_stream")


def test_a_tied_head_steps_with_the_embedding_first():
    from transformers import LlamaConfig, LlamaForCausalLM

    from hpcrl.core.backends.automodel.side_stream_adam import stages_in_forward_order

    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    hf = LlamaForCausalLM(config)
    optimizer = torch.optim.Adam(hf.parameters())
    stages = stages_in_forward_order(optimizer, list(hf.model.layers), hf)
    assert [len(stage) for stage in stages] == [2, 9, 9, 0]
    assert stages[0][0] is hf.model.embed_tokens.weight is hf.lm_head.weight


def test_a_compiled_block_waits_outside_its_graph():
    check_compiled_blocks_wait_outside_their_graph()
