"""Adam/AdamW whose state for a share of the parameters lives in host memory and is stepped
there (``policy.automodel_cfg.optimizer_offload_fraction``, hpcrl's own key).

Why: Automodel trains fp32 parameters with fp32 gradients; AdamW adds two fp32 moments, so an
8B model needs 16 bytes per parameter (119 GiB) on the GPU before activations and the
generation engine's copy. FSDP2's ``CPUOffloadPolicy`` moves parameters and gradients to the
host as well, which needs the whole 119 GiB of host memory and runs forward and backward from
there. This keeps parameters and gradients on the GPU and moves only the moments of a
fraction of the parameters (8 bytes per offloaded parameter) to the host — the idea of
megatron-core's HybridDeviceOptimizer, on the torch optimizer.

One step: the parameters kept on the device step with torch's own Adam (``super().step()``,
fused on the GPU) while the host steps the offloaded ones, chunk by chunk: each chunk's
parameter and gradient slices are copied into a pinned staging buffer (device to host, on a
stream of their own, one chunk ahead), torch's fused CPU Adam updates them with the host
moments, and the updated parameters go back (host to device, another stream) while the next
chunk steps. The GPU parameters stay the only master copy: no host copy of them persists (so
nothing has to be kept in step with a loaded checkpoint or a weight update), at the price of
4 more bytes per offloaded parameter copied each step. Two staging slots of ``chunk_numel``
elements (parameters + gradients) are all the pinned memory it takes.

State is torch Adam's, per parameter (``step``, ``exp_avg``, ``exp_avg_sq``[,
``max_exp_avg_sq``]); only where it lives differs. A checkpoint saved with one fraction loads
with another or into plain ``torch.optim.AdamW`` (and back): ``load_state_dict`` puts each
parameter's state where this optimizer keeps it, without a detour through the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import torch

#: elements per chunk of the host step (128 MiB of fp32 per staging buffer)
DEFAULT_CHUNK_NUMEL = 1 << 25
_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP/TP), a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _like_param(param: torch.Tensor, host_local: torch.Tensor) -> torch.Tensor:
    """A host tensor shaped as ``param``: a DTensor of the same mesh and placements when the
    parameter is one (so checkpoints shard it as they shard the parameter)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return host_local
    return DTensor.from_local(
        host_local,
        device_mesh=param.device_mesh,
        placements=param.placements,
        shape=param.shape,
        stride=param.stride(),
        run_check=False,
    )


def offloaded_prefix(params: Sequence[torch.Tensor], fraction: float) -> list[torch.Tensor]:
    """The parameters whose state goes to the host: the first ones, in order, until their
    elements reach ``fraction`` of all (whole tensors: at least the fraction)."""
    total = sum(local_tensor(p).numel() for p in params)
    target = fraction * total
    chosen: list[torch.Tensor] = []
    taken = 0
    for param in params:
        if taken >= target or fraction <= 0:
            break
        chosen.append(param)
        taken += local_tensor(param).numel()
    return chosen


@attrs.frozen
class Piece:
    """``param``'s flat elements [start, stop) at ``offset`` of a chunk's staging buffer."""

    param: torch.Tensor
    start: int
    stop: int
    offset: int


def plan_chunks(params: Sequence[torch.Tensor], chunk_numel: int) -> list[list[Piece]]:
    """Consecutive pieces of the flattened parameters, at most ``chunk_numel`` elements per
    chunk; a chunk never mixes dtypes (one staging buffer each)."""
    chunks: list[list[Piece]] = []
    current: list[Piece] = []
    used = 0
    for param in params:
        numel = local_tensor(param).numel()
        if current and current[0].param.dtype != param.dtype:
            chunks.append(current)
            current, used = [], 0
        start = 0
        while start < numel:
            if used == chunk_numel:
                chunks.append(current)
                current, used = [], 0
            stop = min(numel, start + chunk_numel - used)
            current.append(Piece(param, start, stop, used))
            used += stop - start
            start = stop
    if current:
        chunks.append(current)
    return chunks


class HostOffloadAdam(torch.optim.Adam):
    """torch's Adam (``decoupled_weight_decay=True``: AdamW) with the state of the first
    ``offload_fraction`` of the parameters in host memory, stepped on the host (module
    docstring). ``host_threads``: torch threads for the host step (a Ray GPU worker runs with
    one by default), None: as the process has them."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        offload_fraction: float,
        chunk_numel: int = DEFAULT_CHUNK_NUMEL,
        host_threads: int | None = None,
        **adam_kwargs: Any,
    ) -> None:
        assert 0.0 <= offload_fraction <= 1.0, offload_fraction
        assert not adam_kwargs.get("capturable") and not adam_kwargs.get("differentiable")
        super().__init__(params, **adam_kwargs)
        ordered = [p for group in self.param_groups for p in group["params"]]
        host = offloaded_prefix(ordered, offload_fraction)
        for param in host:
            assert local_tensor(param).is_contiguous(), "offloaded parameters are flat-copied"
        self.host_params = host
        self._host_ids = {id(p) for p in host}
        self._chunks = plan_chunks(host, chunk_numel)
        self._chunk_numel = chunk_numel
        self._host_threads = host_threads
        self._staging: dict[torch.dtype, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def is_on_host(self, param: torch.Tensor) -> bool:
        return id(param) in self._host_ids

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stepping = [p for p in self.host_params if p.grad is not None]
        for param in stepping:
            self._init_host_state(param)
        host_step = _HostStep(self, stepping)
        host_step.start()  # the first copies run while the device part steps
        stashed = [(p, p.grad) for p in stepping]
        for param in stepping:
            param.grad = None  # torch's step skips parameters without gradients
        try:
            super().step()
        finally:
            for param, grad in stashed:
                param.grad = grad
        with _torch_threads(self._host_threads):
            host_step.run()
        return loss

    def _init_host_state(self, param: torch.Tensor) -> None:
        state = self.state[param]
        if state:
            return
        group = self._group_of(param)
        local = local_tensor(param)
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        names = _MOMENTS if group["amsgrad"] else _MOMENTS[:2]
        for name in names:
            state[name] = _like_param(param, torch.zeros(local.shape, dtype=local.dtype))

    def _group_of(self, param: torch.Tensor) -> dict[str, Any]:
        return next(g for g in self.param_groups if any(p is param for p in g["params"]))

    def staging(self, dtype: torch.dtype, on_gpu: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Two (parameters, gradients) buffers of one chunk each, pinned when copies cross to
        a GPU; made on the first step."""
        if dtype not in self._staging:
            self._staging[dtype] = [
                (self._buffer(dtype, on_gpu), self._buffer(dtype, on_gpu)) for _ in range(2)
            ]
        return self._staging[dtype]

    def _buffer(self, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        return torch.empty(self._chunk_numel, dtype=dtype, pin_memory=pinned)

    # ------------------------------------------------------------------ state placement
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load for the device-side parameters; the host-side ones' state is copied
        into host tensors directly (torch's load would first move it to the parameter's
        device)."""
        ordered = [p for group in self.param_groups for p in group["params"]]
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        assert len(saved_ids) == len(ordered), "a state dict of another set of parameters"
        host_entries = {}
        device_state = dict(state_dict["state"])
        for saved_id, param in zip(saved_ids, ordered, strict=True):
            if self.is_on_host(param) and saved_id in device_state:
                host_entries[id(param)] = (param, device_state.pop(saved_id))
        kept = {pid: self.state[p] for pid, (p, _) in host_entries.items() if self.state[p]}
        super().load_state_dict({**state_dict, "state": device_state})
        for pid, (param, saved) in host_entries.items():
            self.state[param] = self._host_state(param, saved, kept.get(pid))

    def _host_state(
        self, param: torch.Tensor, saved: dict[str, Any], existing: dict[str, Any] | None
    ) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for key, value in saved.items():
            if key == "step":
                state[key] = torch.tensor(float(value), dtype=torch.float32)
                continue
            if not isinstance(value, torch.Tensor):
                state[key] = value
                continue
            old = existing.get(key) if existing else None
            if old is not None and old.shape == value.shape:
                if old is not value:
                    local_tensor(old).copy_(local_tensor(value))
                state[key] = old
            else:
                local = local_tensor(value).to("cpu", dtype=local_tensor(param).dtype)
                state[key] = _like_param(param, local)
        return state

    def move_device_state(self, device: torch.device) -> None:
        """Move the state of the device-side parameters (around generation); the host-side
        state stays where it is."""
        for param, state in self.state.items():
            if self.is_on_host(param):
                continue
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=True)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _HostStep:
    """One step of the host-side parameters, chunk by chunk through two staging slots:
    copies in for chunk i+1 and out for chunk i-1 overlap the host's Adam on chunk i."""

    def __init__(self, optimizer: HostOffloadAdam, params: list[torch.Tensor]) -> None:
        self.optimizer = optimizer
        stepping = {id(p) for p in params}
        self.chunks = [
            [piece for piece in chunk if id(piece.param) in stepping] for chunk in optimizer._chunks
        ]
        self.chunks = [chunk for chunk in self.chunks if chunk]
        self.on_gpu = bool(params) and local_tensor(params[0]).is_cuda
        self.copied_in: list[Any] = [None] * len(self.chunks)
        self.copied_out: list[Any] = [None, None]
        if self.on_gpu:
            self.d2h = torch.cuda.Stream()
            self.h2d = torch.cuda.Stream()

    def _slot(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self.chunks[index][0].param.dtype
        return self.optimizer.staging(dtype, self.on_gpu)[index % 2]

    def start(self) -> None:
        if not self.chunks:
            return
        if self.on_gpu:
            # gradients (clipped) and parameters as the current stream left them
            self.d2h.wait_stream(torch.cuda.current_stream())
        for index in range(min(2, len(self.chunks))):
            self._copy_in(index)

    def _copy_in(self, index: int) -> None:
        params_buf, grads_buf = self._slot(index)
        with self._on(self.d2h if self.on_gpu else None):
            if self.on_gpu and self.copied_out[index % 2] is not None:
                self.d2h.wait_event(self.copied_out[index % 2])
            for piece in self.chunks[index]:
                size = piece.stop - piece.start
                param = local_tensor(piece.param).view(-1)[piece.start : piece.stop]
                grad = local_tensor(piece.param.grad).view(-1)[piece.start : piece.stop]
                params_buf[piece.offset : piece.offset + size].copy_(param, non_blocking=True)
                grads_buf[piece.offset : piece.offset + size].copy_(grad, non_blocking=True)
            if self.on_gpu:
                self.copied_in[index] = torch.cuda.Event()
                self.copied_in[index].record(self.d2h)

    def _copy_out(self, index: int) -> None:
        params_buf, _ = self._slot(index)
        with self._on(self.h2d if self.on_gpu else None):
            for piece in self.chunks[index]:
                size = piece.stop - piece.start
                param = local_tensor(piece.param).view(-1)[piece.start : piece.stop]
                param.copy_(params_buf[piece.offset : piece.offset + size], non_blocking=True)
            if self.on_gpu:
                event = torch.cuda.Event()
                event.record(self.h2d)
                self.copied_out[index % 2] = event

    @staticmethod
    def _on(stream: Any) -> Any:
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def run(self) -> None:
        for index in range(len(self.chunks)):
            if self.on_gpu:
                self.copied_in[index].synchronize()
            self._adam(index)
            self._copy_out(index)
            if index + 2 < len(self.chunks):
                self._copy_in(index + 2)
        stepped = {id(piece.param): piece.param for chunk in self.chunks for piece in chunk}
        for param in stepped.values():
            self.optimizer.state[param]["step"] += 1
        if self.on_gpu:
            torch.cuda.current_stream().wait_stream(self.h2d)

    def _adam(self, index: int) -> None:
        """torch's fused CPU Adam over the chunk's pieces (views of the staging buffers and
        of the host moments). Each piece gets a copy of its parameter's step count, which the
        kernel advances: a parameter split over chunks advances once, after all of them."""
        from torch.optim.adam import adam

        params_buf, grads_buf = self._slot(index)
        chunk = self.chunks[index]
        group = self.optimizer._group_of(chunk[0].param)
        columns: dict[str, list[torch.Tensor]] = {name: [] for name in _MOMENTS}
        params, grads, steps = [], [], []
        for piece in chunk:
            size = piece.stop - piece.start
            state = self.optimizer.state[piece.param]
            params.append(params_buf[piece.offset : piece.offset + size])
            grads.append(grads_buf[piece.offset : piece.offset + size])
            steps.append(state["step"].clone())
            for name in _MOMENTS:
                if name in state:
                    moment = local_tensor(state[name]).view(-1)
                    columns[name].append(moment[piece.start : piece.stop])
        beta1, beta2 = group["betas"]
        adam(
            params,
            grads,
            columns["exp_avg"],
            columns["exp_avg_sq"],
            columns["max_exp_avg_sq"],
            steps,
            foreach=False,
            fused=True,
            decoupled_weight_decay=group.get("decoupled_weight_decay", False),
            amsgrad=group["amsgrad"],
            beta1=float(beta1),
            beta2=float(beta2),
            lr=float(group["lr"]),
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
        )
