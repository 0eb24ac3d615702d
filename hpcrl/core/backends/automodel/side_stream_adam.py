"""``SideStreamAdam``: the one-GPU optimizer step (``master_adam.MasterWeightAdam``) queued on
a stream of its own, so that it runs while the next step starts, and the next forward waits
for each decoder block's update only where it reaches that block.

Why: Adam reads and writes ~28 bytes a parameter (7 ms a step for 1.1 B parameters on an
H200) and computes nothing; the step that follows begins with host work the GPU idles
through (uploads, bookkeeping: the queue is empty after the step's read-back), then a
forward of matmuls that leave most of the memory bandwidth unused. On one stream Adam runs
alone between the two; here it runs under them (docs/performance.md, issue 25 item 1).

The update is launched in the order a forward uses the weights: first everything outside the
decoder blocks and the head (embedding, final norm), then block 0, 1, ..., then the head
(the output embedding, unless it is the input embedding); an event after each stage. The
model's root waits for stage 0 before its forward (a forward pre-hook), each block for its
own stage just before it runs (a wrapper in front of the block's call where the block is
compiled, so the wait is never traced), and the head's stage is waited for when the decoder
returns (a forward hook): the log-prob head multiplies by its weight without calling it.
``settle`` makes the current stream wait for the whole update; the worker calls it before
anything else reads the weights or the optimizer state (log-probs of another model, refit,
checkpoints, offload) and after the first micro-batch's forward, before any backward writes
gradients. The gradients and the
clip factor the update reads are held until then: ``zero_grad`` drops the worker's
references while the side stream may still read them, and the caching allocator must not
hand their memory to the next forward first.

Each update is timed by two events on the side stream; ``take_update_seconds`` sums the
updates the device has finished (without waiting: one still running counts at the next
call), so ``time_train_optimizer_s`` still holds the update, as it runs beside other work.

The stream calls go through ``streams`` (``torch.cuda`` itself in the worker): CUDA streams
exist only on a GPU, so the CPU tests hand in a stand-in that records the order of the
launches and waits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hpcrl.core.backends.automodel.master_adam import MasterWeightAdam
from hpcrl.core.backends.automodel.parallelize import decoder_layers


class SideStreamAdam:
    """``optimizer.step()`` on a side stream, waited for per stage by ``root``'s forward."""

    def __init__(self, optimizer: MasterWeightAdam, root: nn.Module, streams: Any = None):
        self.optimizer = optimizer
        self.streams = torch.cuda if streams is None else streams
        self.side = self.streams.Stream()
        layers = list(decoder_layers(root.hf))
        self.stages = stages_in_forward_order(optimizer, layers, root.hf)
        # per stage, the event after its update; None once the current stream waited for it
        self._pending: list[Any] = [None] * len(self.stages)
        self._read: list[torch.Tensor] = []
        self._timed: list[tuple[Any, Any]] = []  # (start, end) events of unread updates
        self._update_s = 0.0  # finished updates' device seconds since the last take
        self.hooks = [root.register_forward_pre_hook(lambda _module, _args: self.wait_for(0))]
        for index, layer in enumerate(layers, start=1):
            self.hooks.append(wait_before_call(layer, functools.partial(self.wait_for, index)))
        last = len(self.stages) - 1
        self.hooks.append(
            root.hf.get_decoder().register_forward_hook(lambda *_: self.wait_for(last))
        )

    def step(self) -> None:
        """The optimizer's step, queued on the side stream after what the current stream
        queued so far (the gradients and the clip factor)."""
        self.settle()  # a step queued twice without a forward between: the first one first
        self._add_finished()
        current = self.streams.current_stream()
        self.side.wait_stream(current)
        started, ended = (self.streams.Event(enable_timing=True) for _ in range(2))
        with self.streams.stream(self.side):
            started.record()
            self._read = self.optimizer.step_in_stages(self.stages, self._stage_done)
            ended.record()
        self._timed.append((started, ended))

    def take_update_seconds(self) -> float:
        """Device seconds of the updates finished since the last call (no wait)."""
        self._add_finished()
        seconds, self._update_s = self._update_s, 0.0
        return seconds

    def _add_finished(self) -> None:
        while self._timed and self._timed[0][1].query():
            started, ended = self._timed.pop(0)
            self._update_s += started.elapsed_time(ended) / 1e3

    def _stage_done(self, index: int) -> None:
        self._pending[index] = self.side.record_event()

    def wait_for(self, stage: int) -> None:
        event = self._pending[stage]
        if event is not None:
            self.streams.current_stream().wait_event(event)
            self._pending[stage] = None

    def settle(self) -> None:
        """The current stream waits for the whole update; what it read is let go."""
        if self._read or any(event is not None for event in self._pending):
            self.streams.current_stream().wait_stream(self.side)
            self._pending = [None] * len(self.stages)
            self._read = []

    def remove(self) -> None:
        self.settle()
        for hook in self.hooks:
            hook.remove()


def stages_in_forward_order(
    optimizer: torch.optim.Optimizer, layers: list[nn.Module], root_hf: nn.Module
) -> list[list[nn.Parameter]]:
    """The optimizer's parameters: stage i + 1 layer i's, the last stage the head's own
    (none where it is tied to the input embedding, which comes first), stage 0 the others."""
    stage_of = {id(p): index for index, layer in enumerate(layers, 1) for p in layer.parameters()}
    head, embedding = root_hf.get_output_embeddings(), root_hf.get_input_embeddings()
    if head is not None:
        firsts = {id(p) for p in embedding.parameters()} if embedding is not None else set()
        for param in head.parameters():
            if id(param) not in firsts:
                stage_of.setdefault(id(param), len(layers) + 1)
    stages: list[list[nn.Parameter]] = [[] for _ in range(len(layers) + 2)]
    for group in optimizer.param_groups:
        for param in group["params"]:
            stages[stage_of.get(id(param), 0)].append(param)
    return stages


class _WaitThenCall:
    """A compiled block's ``_compiled_call_impl`` with a wait in front, run eagerly."""

    def __init__(self, layer: nn.Module, wait: Callable[[], None], call: Callable[..., Any]):
        self.layer, self.wait, self.call = layer, wait, call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.wait()
        return self.call(*args, **kwargs)

    def remove(self) -> None:
        self.layer._compiled_call_impl = self.call


def wait_before_call(layer: nn.Module, wait: Callable[[], None]) -> Any:
    """Runs ``wait`` before each call of ``layer``; returns what ``.remove()`` undoes. A
    compiled block (``Module.compile``) traces its hooks into its graph: there the wait goes
    in front of the compiled call instead, as ``aot_block`` puts its kept compilations."""
    compiled = getattr(layer, "_compiled_call_impl", None)
    if compiled is None:
        return layer.register_forward_pre_hook(lambda _module, _args: wait())
    wrapper = _WaitThenCall(layer, wait, compiled)
    layer._compiled_call_impl = wrapper
    return wrapper
