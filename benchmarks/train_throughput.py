"""Benchmark: the Automodel backend's train step against the strongest plain loops, side by side.

Same weights (a random-init Llama-shaped ~1.1B model: 16 layers, hidden 2048, 16 heads, FFN
5632, vocab 32000), same batch (random tokens, batch 4 × seq 2048), same optimizer (AdamW,
clip 1.0), one process (world 1). Rows:

- ``backend``: hpcrl's real worker class (``TrainingWorker`` → ``AutomodelWorker``): no FSDP at
  world 1, on a GPU bf16 compute copies of the fp32 linear weights stepped by
  ``MasterWeightAdam`` (clip factor inside its kernel), chunked log-probs without full-vocab
  fp32 logits, per-block ``torch.compile``.
- ``plain``: what a user would write for one GPU — HF ``LlamaForCausalLM(labels=...)`` with SDPA,
  fp32 weights under ``torch.autocast(bf16)``, every decoder layer ``.compile()``d, no FSDP,
  fused AdamW, foreach clipping, ``use_cache=False``.
- ``plain-bf16-residual``: the same loop with its embedding's output cast to bf16 (one hook):
  the residual stream in bf16, the backend's numerics (``parallelize.apply_autocast``, as
  FSDP's bf16 mixed precision) where ``plain`` keeps autocast's fp32 stream.
- ``naive-fsdp``: the same HF loop wrapped in FSDP2 (``fully_shard`` per block and root, bf16
  mixed precision) at world 1, no compile: what a multi-GPU script does when run on one GPU.
- ``backend-mask`` (an experiment row, not in the default ``--loops``): the backend's input
  path as it was before issue 25: the attention mask passed to the model and one more
  padding column (2048 -> 2112), so SDPA runs a masked kernel over the full S×S scores (the
  A/B of the regression, 73.1k -> 61.7k tok/s).
- ``backend-before`` (an experiment row): the backend's step as it was before the compute
  copies, the kept head and the fused head (2026-12-06): fp32 linear weights under autocast
  with torch's fused AdamW and foreach clipping, each lm_head chunk recomputed in backward
  through torch's float32 log-softmax.
- ``backend-foreach-norm`` (an experiment row): the backend clipping with torch's per-tensor
  ``_foreach_norm`` instead of ``grad_norm.GlobalNorm``'s one launch per dtype.
- ``backend-fp32-residual`` (an experiment row): the backend with its residual stream in
  fp32, as autocast alone leaves it (``parallelize.apply_autocast``'s cast removed).
- ``backend-static-compile`` (an experiment row): the backend with its decoder blocks
  compiled for static sizes (the product compiles them for dynamic sizes).
- ``backend-transformers-mask`` (an experiment row): attention through transformers' SDPA
  with its mask construction, as before ``causal_attention`` (transformers 5 reads a
  packed-sequence check back at every forward).
- ``backend-per-tensor-copies`` (an experiment row): each input tensor copied to the GPU by
  itself from pageable memory, as before ``device_upload``.
- ``backend-adam-inline`` (an experiment row): the optimizer step on the step's own stream
  after the backward, as before ``side_stream_adam`` (the product runs it on a stream of its
  own, under the next step's start and forward). A step is timed to the end of its own
  stream's work; each window's last step also waits for every stream.
- ``backend-high-priority`` (an experiment row, GPU only): the backend with every step queued
  on a stream of the highest priority, the side-stream update keeping the lowest: the
  scheduler then gives the forward's blocks the SMs first and the update the rest (the
  side stream hid ~2.4 of ~9 ms of update at equal priority, 2026-12-07). On a CPU it is the
  backend row.

``--profile-dir DIR``: after the rounds, each loop's next ``--profile-steps`` steps under
torch.profiler, twice: ``DIR/train-<loop>.txt`` with the host's operators and
``DIR/train-<loop>-device.txt`` of the device alone, whose idle gaps are a plain run's
(``hpcrl.core.profiling``: wall against device busy time, the top kernels, the idle gaps,
the operators).

The HF loops are built once and stay resident together; after their warm-up (compile) the
timing runs in ``--rounds`` rounds of ``--steps`` steps per loop, the loop order reversed every
other round, so drift (clocks, other load) hits every loop alike. Reported per loop: tokens/s
(median over rounds of each round's median step) with the spread over rounds, MFU under both
attention conventions (``benchmarks/mfu.py``), peak memory of that loop alone, the first loss
(equal weights and batch: the loops must agree), and the backend against the best plain row,
per round (median and range). It ends with one ``summary`` line per row (tok/s, spread, ratio
to the best baseline of its group: ``benchmarks/throughput_report.py``) and the wall time.

Megatron rows (``benchmarks/train_throughput_megatron.py``; each loop in its own process, its
``--rounds`` windows timed one after the other; every row run ``--megatron-repeats`` times, the
row order reversed on every other pass): hpcrl's Megatron backend (its setup functions and
``MegatronWorker.train_step``) against the best raw megatron-core row (megatron-core's own
``forward_backward_func`` and model loss; local spec with megatron's unfused attention, with the
same SDPA attention hpcrl uses, and the Transformer Engine spec wherever TE is installed).

    python benchmarks/train_throughput.py --device cuda                 # every row, one H200
    python benchmarks/train_throughput.py --device cuda --skip-megatron # HF rows only
    python benchmarks/train_throughput.py --only megatron-raw --megatron-attention sdpa
    python benchmarks/train_throughput.py --device cpu --tiny           # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.mfu import flops_per_token  # noqa: E402
from benchmarks.throughput_report import report  # noqa: E402

MEGATRON_LOOPS = ("megatron", "megatron-raw")
HF_LOOPS = ("backend", "plain", "plain-bf16-residual", "naive-fsdp")
EXPERIMENT_LOOPS = (
    "backend-mask",
    "backend-before",
    "backend-foreach-norm",
    "backend-fp32-residual",
    "backend-static-compile",
    "backend-transformers-mask",
    "backend-per-tensor-copies",
    "backend-adam-inline",
    "backend-high-priority",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per loop per round")
    parser.add_argument("--rounds", type=int, default=4, help="timing rounds (order alternates)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument(
        "--gc-freeze", action="store_true",
        help="after every loop is built, move what is alive out of Python's garbage "
        "collections (each loop alone in its process would not scan the others' objects)",
    )  # fmt: skip
    parser.add_argument(
        "--micro-batch-rows", type=int, default=None,
        help="the backend rows' micro-batch (default: the whole batch in one); the plain "
        "loops always take the whole batch at once",
    )  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="tiny Llama (CPU smoke test)")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile anywhere")
    parser.add_argument("--loops", default=",".join(HF_LOOPS), help="HF loops to run")
    parser.add_argument("--skip-megatron", action="store_true", help="HF rows only")
    parser.add_argument(
        "--backend-compile", choices=("dynamic", "static"), default="dynamic",
        help="static: an experiment, the backend's blocks compiled with static sizes (the "
        "product compiles them dynamic so GRPO's new lengths never recompile)",
    )  # fmt: skip
    parser.add_argument("--only", choices=MEGATRON_LOOPS, default=None, help="(child process)")
    parser.add_argument("--megatron-steps", type=int, default=5, help="timed steps per window")
    parser.add_argument(
        "--megatron-repeats", type=int, default=2,
        help="processes per Megatron row, row order reversed on every other pass",
    )  # fmt: skip
    parser.add_argument(
        "--megatron-attention",
        default="sdpa",
        help="core attention of the 'megatron' row: sdpa (hpcrl's default without TE), "
        "unfused (the local spec's own), or both comma-separated (one row each); with --only "
        "megatron-raw also te",
    )
    parser.add_argument("--json-out", default=None, help="(megatron child) write the result here")
    parser.add_argument("--profile-dir", type=Path, default=None, help="profile summaries here")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument(
        "--trace-loops", default="",
        help="with --profile-dir: these loops' profiled steps also as a gzipped Chrome trace "
        "(train-<loop>.trace.json.gz; benchmarks/launch_lag.py reads it)",
    )  # fmt: skip
    parser.add_argument(
        "--trace-python", action="store_true",
        help="with --trace-loops: the traces also hold the Python calls (names the host time "
        "between operators; the host runs slower while traced)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.megatron_attention = args.megatron_attention.split(",")
    allowed = {"sdpa", "unfused"} | ({"te"} if args.only == "megatron-raw" else set())
    if not set(args.megatron_attention) <= allowed:
        parser.error(f"--megatron-attention: {sorted(allowed)}, not {args.megatron_attention}")
    args.loops = [name for name in args.loops.split(",") if name]
    args.trace_loops = [name for name in args.trace_loops.split(",") if name]
    if not set(args.loops) <= set(HF_LOOPS + EXPERIMENT_LOOPS):
        parser.error(f"--loops: some of {HF_LOOPS + EXPERIMENT_LOOPS}, not {args.loops}")
    if args.tiny and args.seq_len == 2048:
        args.seq_len = 64
    return args


def model_spec(tiny: bool):
    from hpcrl.core.models.tiny import TINY_SPECS

    return TINY_SPECS["llama" if tiny else "llama-1b"]


def build_checkpoint(tiny: bool, out_dir: str) -> str:
    """A random-init HF checkpoint (bf16 on disk: half the bytes to write; loaded as fp32)."""
    from hpcrl.core.models.tiny import build_random_model

    spec = model_spec(tiny)
    model = build_random_model(spec, vocab_size=spec.vocab_size or 256)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    return out_dir


def make_batch(vocab: int, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)
    token_mask = torch.ones(batch_size, seq_len)
    token_mask[:, 0] = 0  # the first token has no prediction
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long),
        "token_mask": token_mask,
    }


def nll_loss(
    logprobs: torch.Tensor, batch: dict, num_global_tokens: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean token NLL, the same quantity as HF's ``labels=`` loss."""
    return -(logprobs * batch["token_mask"]).sum() / num_global_tokens, {}


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def synchronize_stream(device: str) -> None:
    """The current stream's work done: a step's end. Work a loop queued on another stream
    (the backend's optimizer step, ``side_stream_adam``) may run on into the next step, as in
    a training loop, and ``time_window`` waits for it at the window's end."""
    if device == "cuda":
        torch.cuda.current_stream().synchronize()


def allocated_gib(device: str) -> float:
    return torch.cuda.memory_allocated() / 2**30 if device == "cuda" else float("nan")


# --------------------------------------------------------------------------- timing
@dataclass
class Loop:
    """A built loop: its step (returns the loss) and what it measured so far."""

    name: str
    step: Callable[[], float]
    close: Callable[[], None] = lambda: None
    # the backend worker an experiment row steps by itself (None elsewhere): what a row that
    # reports the worker's own settings reads
    worker: Any = None
    first_loss: float = float("nan")
    last_loss: float = float("nan")  # after every loop's same number of steps: must agree
    resident_gib: float = float("nan")  # its weights, grads, optimizer state after warm-up
    peak_gib: float = float("nan")  # resident + the most one of its steps added on top
    windows: list[list[float]] = field(default_factory=list)  # step seconds, per round
    gc_seconds: float = 0.0  # Python's garbage collections during its timed steps
    gc_runs: dict[int, int] = field(default_factory=dict)  # generation -> collections
    # its model's input embedding, and per timed step the host seconds from the step's call
    # to the embedding's forward: a step starts with an empty queue, so on a GPU that host
    # work (uploads, checks, bookkeeping) is device idle
    embedding: Any = None
    start_delays_s: list[float] = field(default_factory=list)


def warm_up(loop: Loop, device: str, warmup: int, before_gib: float) -> None:
    loop.first_loss = loop.step()
    for _ in range(warmup - 1):
        loop.step()
    synchronize(device)
    loop.resident_gib = allocated_gib(device) - before_gib


def time_window(loop: Loop, device: str, steps: int) -> None:
    """``steps`` timed steps; the loop's peak is its resident memory plus the largest amount
    a step allocated above what every resident loop held at the window's start."""
    synchronize(device)
    base_gib = allocated_gib(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    with collections_counted(loop), embedding_reached(loop) as reached_at:
        for _ in range(steps):
            reached_at.clear()
            start = time.perf_counter()
            loop.last_loss = loop.step()
            synchronize_stream(device)
            times.append(time.perf_counter() - start)
            if reached_at:
                loop.start_delays_s.append(reached_at[0] - start)
        start = time.perf_counter()
        synchronize(device)  # what other streams still run counts in the window's last step
        times[-1] += time.perf_counter() - start
    if device == "cuda":
        extra_gib = torch.cuda.max_memory_allocated() / 2**30 - base_gib
        peak_gib = loop.resident_gib + extra_gib
        loop.peak_gib = peak_gib if math.isnan(loop.peak_gib) else max(loop.peak_gib, peak_gib)
    loop.windows.append(times)


@contextlib.contextmanager
def collections_counted(loop: Loop):
    """Adds the garbage collections that run inside the block to ``loop``'s count and time."""
    started: list[float] = []

    def on_collection(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            loop.gc_seconds += time.perf_counter() - started.pop()
            generation = info["generation"]
            loop.gc_runs[generation] = loop.gc_runs.get(generation, 0) + 1

    gc.callbacks.append(on_collection)
    try:
        yield
    finally:
        gc.callbacks.remove(on_collection)


@contextlib.contextmanager
def embedding_reached(loop: Loop):
    """Yields a list that gets the host clock whenever ``loop.embedding``'s forward starts."""
    reached_at: list[float] = []
    handle = None
    if loop.embedding is not None:
        handle = loop.embedding.register_forward_pre_hook(
            lambda _module, _args: reached_at.append(time.perf_counter())
        )
    try:
        yield reached_at
    finally:
        if handle is not None:
            handle.remove()


def print_step_details(loops: list[Loop]) -> None:
    """Per loop: the median, fastest and slowest timed step, the first step of each window,
    and the garbage collections that ran during its timed steps."""
    for loop in loops:
        steps_ms = sorted(1e3 * t for window in loop.windows for t in window)
        firsts_ms = " ".join(f"{1e3 * window[0]:.1f}" for window in loop.windows if window)
        runs = " ".join(f"gen{g}: {n}" for g, n in sorted(loop.gc_runs.items())) or "none"
        start = (
            f"; call -> embedding median {1e3 * statistics.median(loop.start_delays_s):.2f} ms"
            if loop.start_delays_s
            else ""
        )
        print(f"steps {loop.name}: median {statistics.median(steps_ms):.1f} ms, fastest "
              f"{steps_ms[0]:.1f}, slowest {steps_ms[-1]:.1f}; windows' first steps {firsts_ms} "
              f"ms; garbage collections {runs}, {1e3 * loop.gc_seconds:.1f} ms in all{start}")  # fmt: skip


def time_rounds(loops: list[Loop], device: str, rounds: int, steps: int) -> None:
    """Round r times every loop for ``steps`` steps, in reversed order on odd rounds."""
    for index in range(rounds):
        for loop in loops if index % 2 == 0 else loops[::-1]:
            time_window(loop, device, steps)


def time_windows_here(args: argparse.Namespace, device: str):
    """For a loop alone in its process (Megatron): warm-up, then ``--rounds`` windows."""

    def run(step: Callable[[], float], steps: int) -> dict:
        loop = Loop("megatron", step)
        warm_up(loop, device, args.warmup, 0.0)
        for _ in range(args.rounds):
            time_window(loop, device, steps)
        return {"windows": loop.windows, "first_loss": loop.first_loss, "peak_gib": loop.peak_gib}

    return run


# --------------------------------------------------------------------------- HF loops
def make_recipe(
    model_path: str,
    args: argparse.Namespace,
    *,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    lr: float = 1e-5,
    dp_replicate: int = 1,
    num_steps: int | None = None,
):
    """The benchmark's SFT recipe; the batch defaults to ``--batch-size`` in micro-batches
    of ``--micro-batch-rows`` (default: one micro-batch) and the steps to every round's (scaling_automodel.py passes its own batch, lr, HSDP
    replicas and step count)."""
    from hpcrl.config.recipe import (
        AutomodelCfg,
        DataCfg,
        OptimizerCfg,
        PolicyCfg,
        Recipe,
        SftCfg,
    )

    global_batch = args.batch_size if global_batch is None else global_batch
    if micro_batch is None:
        micro_batch = getattr(args, "micro_batch_rows", None) or global_batch
    return Recipe(
        policy=PolicyCfg(
            model_name=model_path,
            train_global_batch_size=global_batch,
            train_micro_batch_size=micro_batch,
            precision="bfloat16" if args.device == "cuda" else "float32",
            max_grad_norm=1.0,
            optimizer=OptimizerCfg(name="torch.optim.AdamW", kwargs={"lr": lr}),
            automodel_cfg=AutomodelCfg(
                enabled=True, dp_replicate_size=dp_replicate, torch_compile=not args.no_compile
            ),
        ),
        data=DataCfg(train_path="unused.jsonl"),
        sft=SftCfg(
            max_num_steps=num_steps
            if num_steps is not None
            else args.rounds * args.steps + args.warmup
        ),
    )


def single_rank_info(device: str, port: int):
    from hpcrl.core.backends.base import RankInfo

    return RankInfo(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
        device=device,
    )


def start_backend(model_path: str, args: argparse.Namespace):
    """hpcrl's worker for rank 0 of a world of 1 (it creates the process group)."""
    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.workers.actor import TrainingWorker
    from hpcrl.core.workers.group import worker_env

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    static = args.backend_compile == "static"
    with static_block_compile() if static else contextlib.nullcontext():
        worker = TrainingWorker(worker_class_path("automodel"), worker_env(args.device))
        rank_info = single_rank_info(args.device, port)
        worker.setup(make_recipe(model_path, args), rank_info, model_path, os.cpu_count() or 1)
    return worker


@contextlib.contextmanager
def static_block_compile():
    """The experiment of ``--backend-compile static`` and row ``backend-static-compile``:
    while a worker is set up in this block, its ``apply_compile`` compiles each decoder block
    with static sizes, to measure what the product's dynamic-size compile costs on
    fixed-length batches."""
    import torch._dynamo

    from hpcrl.core.backends.automodel import parallelize

    def apply_static_compile(hf_model, backend="inductor", *, precompiled=None) -> None:
        layers = parallelize.decoder_layers(hf_model)
        torch._dynamo.config.recompile_limit = max(
            torch._dynamo.config.recompile_limit, len(layers) + 8
        )
        for layer in layers:
            layer.compile(fullgraph=False, dynamic=False, backend=backend)

    # ``parallelize.compile_blocks`` calls its module's ``apply_compile`` (no kept compilations)
    product_compile = parallelize.apply_compile
    parallelize.apply_compile = apply_static_compile
    print("backend compile: static sizes (an experiment)", flush=True)
    try:
        yield
    finally:
        parallelize.apply_compile = product_compile


def fixed_plan(rows: int, rows_per_micro_batch: int, width: int) -> list:
    """The controller's plan for fixed micro-batches: consecutive rows at full width."""
    from hpcrl.core.workers.micro_batches import MicroBatchSpec

    return [
        MicroBatchSpec(rows=tuple(range(start, min(start + rows_per_micro_batch, rows))),
                       width=width)
        for start in range(0, rows, rows_per_micro_batch)
    ]  # fmt: skip


def micro_batch_rows(args: argparse.Namespace) -> int:
    return args.micro_batch_rows or args.batch_size


def split_rows(batch: dict, args: argparse.Namespace) -> list[dict]:
    """The batch in micro-batches of ``--micro-batch-rows`` consecutive rows."""
    rows = micro_batch_rows(args)
    return [
        {key: value[start : start + rows] for key, value in batch.items()}
        for start in range(0, args.batch_size, rows)
    ]


def backend_loop(worker, batch: dict, args: argparse.Namespace) -> Loop:
    num_tokens = float(batch["token_mask"].sum())
    plan = fixed_plan(args.batch_size, micro_batch_rows(args), args.seq_len)

    def step() -> float:
        return worker.train(batch, nll_loss, num_tokens, plan)["loss"]

    embedding = worker._backend.model.hf.get_input_embeddings()
    # run_hf_loops closes the worker last (it owns the group)
    return Loop("backend", step, embedding=embedding)


def backend_mask_loop(model_path: str, batch: dict, args: argparse.Namespace) -> Loop:
    """A second backend worker (the process group exists) with the pre-issue-25 input path:
    the attention mask passed, one padding column more (experiment row ``backend-mask``)."""
    import torch.nn.functional as F

    from hpcrl.core.backends.automodel.worker import AutomodelWorker

    worker = AutomodelWorker()
    worker.setup(make_recipe(model_path, args), single_rank_info(args.device, 0), model_path)

    def old_padding(micro: dict) -> dict:
        # the old bucketing always added a column: 2048 -> 2049 -> the next bucket, 2112
        widened = {k: F.pad(v, (0, 1)) if v.dim() == 2 else v for k, v in micro.items()}
        return AutomodelWorker._padded(worker, widened)

    worker._padded = old_padding  # type: ignore[method-assign]
    worker._causal_only = lambda micro: False  # type: ignore[method-assign]
    num_tokens = float(batch["token_mask"].sum())

    def step() -> float:
        return worker.train_step(split_rows(batch, args), nll_loss, num_tokens)["loss"]

    embedding = worker.model.hf.get_input_embeddings()
    return Loop("backend-mask", step, close=worker.close, worker=worker, embedding=embedding)


def backend_before_loop(model_path: str, batch: dict, args: argparse.Namespace) -> Loop:
    """A second backend worker (the process group exists) without compute copies, its head
    recomputed in backward (experiment row ``backend-before``)."""
    from hpcrl.core.backends.automodel.worker import AutomodelWorker

    worker = AutomodelWorker()
    worker.master_weights = False
    worker.setup(make_recipe(model_path, args), single_rank_info(args.device, 0), model_path)
    worker.model.head_keep_bytes = 0
    worker.model.fused_head = False
    num_tokens = float(batch["token_mask"].sum())

    def step() -> float:
        return worker.train_step(split_rows(batch, args), nll_loss, num_tokens)["loss"]

    embedding = worker.model.hf.get_input_embeddings()
    return Loop("backend-before", step, close=worker.close, worker=worker, embedding=embedding)


def backend_variant_loop(
    name: str,
    model_path: str,
    batch: dict,
    args: argparse.Namespace,
    change: Callable = lambda worker: None,
    setup_context: Callable = contextlib.nullcontext,
) -> Loop:
    """A second backend worker (the process group exists), set up inside ``setup_context()``
    and set apart by ``change(worker)`` after its setup: an experiment row."""
    from hpcrl.core.backends.automodel.worker import AutomodelWorker

    worker = AutomodelWorker()
    with setup_context():
        worker.setup(make_recipe(model_path, args), single_rank_info(args.device, 0), model_path)
    change(worker)
    num_tokens = float(batch["token_mask"].sum())

    def step() -> float:
        return worker.train_step(split_rows(batch, args), nll_loss, num_tokens)["loss"]

    embedding = worker.model.hf.get_input_embeddings()
    return Loop(name, step, close=worker.close, worker=worker, embedding=embedding)


def torch_norms(worker) -> None:
    """``backend-foreach-norm``: clipping through torch's per-tensor norms (what
    ``grad_norm.GlobalNorm`` is worth)."""
    if hasattr(worker.optimizer, "global_norm"):
        worker.optimizer.global_norm = None


def fp32_residual(worker) -> None:
    """``backend-fp32-residual``: the residual stream in fp32, as autocast alone leaves it
    (what ``apply_autocast``'s cast of the embedding's output is worth)."""
    if worker.model.residual_cast is not None:
        worker.model.residual_cast.remove()
        worker.model.residual_cast = None


def transformers_mask(worker) -> None:
    """``backend-transformers-mask``: attention through transformers' SDPA with its mask
    construction (the packed-sequence check that reads back every forward), as before
    ``causal_attention``."""
    worker.model.hf.config._attn_implementation = "sdpa"


def per_tensor_copies(worker) -> None:
    """``backend-per-tensor-copies``: each input tensor copied to the GPU by itself from
    pageable memory, as before ``device_upload``."""
    padded = worker._padded

    def on_device(micro_batches):
        return [
            {key: value.to(worker.device, non_blocking=True) for key, value in padded(m).items()}
            for m in micro_batches
        ]

    worker._on_device = on_device


def adam_inline(worker) -> None:
    """``backend-adam-inline``: the optimizer step on the step's own stream, after the
    backward, as before ``side_stream_adam``."""
    if worker.adam_stream is not None:
        worker.adam_stream.remove()
        worker.adam_stream = None


def high_priority_loop(model_path: str, batch: dict, args: argparse.Namespace) -> Loop:
    """``backend-high-priority``: the backend's steps on a stream of the highest priority; the
    current stream then waits for it, so a step still ends when its own work is done."""
    loop = backend_variant_loop("backend-high-priority", model_path, batch, args)
    if args.device != "cuda":
        return loop
    high = torch.cuda.Stream(priority=-100)  # out of range: the greatest priority there is
    side = loop_worker_side_priority(loop)
    print(f"backend-high-priority: step stream priority {high.priority}, update {side}", flush=True)
    train_step = loop.step

    def step() -> float:
        high.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(high):
            loss = train_step()
        torch.cuda.current_stream().wait_stream(high)
        return loss

    loop.step = step
    return loop


def loop_worker_side_priority(loop: Loop) -> str:
    """The side-stream update's stream priority, read off the loop's backend worker."""
    adam_stream = getattr(loop.worker, "adam_stream", None)
    return "none (no side stream)" if adam_stream is None else str(adam_stream.side.priority)


def hf_model(model_path: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation="sdpa"
    ).to(device)


def hf_step(model, optimizer, batch: dict, device: str, autocast) -> Callable[[], float]:
    """HF's own loss (``labels=``: full-vocab logits), clip 1.0, optimizer step."""
    input_ids = batch["input_ids"].to(device)
    mask = batch["attention_mask"].to(device)

    def step() -> float:
        with autocast():
            loss = model(
                input_ids=input_ids, attention_mask=mask, labels=input_ids, use_cache=False
            ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def plain_loop(
    model_path: str, batch: dict, args: argparse.Namespace, bf16_residual: bool = False
) -> Loop:
    """The strongest plain one-GPU loop: autocast bf16, per-block compile, no FSDP, fused AdamW.
    ``bf16_residual`` (row ``plain-bf16-residual``): on a GPU its embedding's output cast to
    bf16, the backend's numerics (FSDP's bf16 mixed precision), a line a user could add."""
    model = hf_model(model_path, args.device)
    if bf16_residual and args.device == "cuda":
        model.get_input_embeddings().register_forward_hook(
            lambda _module, _args, output: output.to(torch.bfloat16)
        )
    if not args.no_compile:
        for layer in model.model.layers:
            layer.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=args.device == "cuda" or None)
    if args.device == "cuda":
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:  # the backend trains in fp32 on the CPU too
        autocast = contextlib.nullcontext
    name = "plain-bf16-residual" if bf16_residual else "plain"
    step = hf_step(model, optimizer, batch, args.device, autocast)
    return Loop(name, step, embedding=model.get_input_embeddings())


def naive_fsdp_loop(model_path: str, batch: dict, args: argparse.Namespace) -> Loop:
    """HF forward with labels, FSDP2 per block + root (bf16 mixed precision), fused AdamW."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = hf_model(model_path, args.device)
    mp = {}
    if args.device == "cuda":
        mp["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    for layer in model.model.layers:
        fully_shard(layer, **mp)
    fully_shard(model, **mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=args.device == "cuda" or None)
    step = hf_step(model, optimizer, batch, args.device, contextlib.nullcontext)
    return Loop("naive-fsdp", step, embedding=model.get_input_embeddings())


def run_hf_loops(args: argparse.Namespace, batch: dict) -> dict[str, Loop]:
    """Build and warm up every HF loop (all stay resident), then the alternating rounds."""
    loops: list[Loop] = []
    with tempfile.TemporaryDirectory(prefix="hpcrl-bench-") as tmp:
        model_path = build_checkpoint(args.tiny, tmp)
        worker = start_backend(model_path, args)  # also the process group FSDP needs
        try:
            builders = {
                "backend": lambda: backend_loop(worker, batch, args),
                "plain": lambda: plain_loop(model_path, batch, args),
                "plain-bf16-residual": lambda: plain_loop(model_path, batch, args, True),
                "naive-fsdp": lambda: naive_fsdp_loop(model_path, batch, args),
                "backend-mask": lambda: backend_mask_loop(model_path, batch, args),
                "backend-before": lambda: backend_before_loop(model_path, batch, args),
                "backend-foreach-norm": lambda: backend_variant_loop(
                    "backend-foreach-norm", model_path, batch, args, torch_norms
                ),
                "backend-fp32-residual": lambda: backend_variant_loop(
                    "backend-fp32-residual", model_path, batch, args, fp32_residual
                ),
                "backend-transformers-mask": lambda: backend_variant_loop(
                    "backend-transformers-mask", model_path, batch, args, transformers_mask
                ),
                "backend-per-tensor-copies": lambda: backend_variant_loop(
                    "backend-per-tensor-copies", model_path, batch, args, per_tensor_copies
                ),
                "backend-adam-inline": lambda: backend_variant_loop(
                    "backend-adam-inline", model_path, batch, args, adam_inline
                ),
                "backend-high-priority": lambda: high_priority_loop(model_path, batch, args),
                "backend-static-compile": lambda: backend_variant_loop(
                    "backend-static-compile",
                    model_path,
                    batch,
                    args,
                    setup_context=static_block_compile,
                ),  # fmt: skip
            }
            for name in args.loops:
                before_gib = allocated_gib(args.device)
                started = time.perf_counter()
                loop = builders[name]()
                warm_up(loop, args.device, args.warmup, before_gib)
                resident = "" if args.device != "cuda" else f", {loop.resident_gib:.1f} GiB"
                print(f"{name}: built and warmed up in {time.perf_counter() - started:.1f} s"
                      f"{resident}", flush=True)  # fmt: skip
                loops.append(loop)
            if args.gc_freeze:
                gc.collect()
                gc.freeze()  # later collections skip every loop's long-lived objects
            time_rounds(loops, args.device, args.rounds, args.steps)
            print_step_details(loops)
            if args.profile_dir is not None:
                profile_loops(loops, args)
        finally:
            for loop in loops:
                loop.close()
            worker.close()
    return {loop.name: loop for loop in loops}


def profile_loops(loops: list[Loop], args: argparse.Namespace) -> None:
    from hpcrl.core.profiling import profiled

    for loop in loops:
        title = (
            f"{loop.name}: {args.profile_steps} train steps of {args.batch_size} x {args.seq_len}"
        )
        # With host ops (the operator table), then the device alone: the idle gaps of a
        # step whose host runs at its unprofiled speed.
        for suffix, host_ops in (("", True), ("-device", False)):
            path = args.profile_dir / f"train-{loop.name}{suffix}.txt"
            traced = host_ops and loop.name in args.trace_loops
            trace = args.profile_dir / f"train-{loop.name}.trace.json.gz" if traced else None
            with profiled(
                path,
                title + ("" if host_ops else ", device only"),
                host_ops=host_ops,
                trace_path=trace,
                python_frames=traced and args.trace_python,
            ):
                for _ in range(args.profile_steps):
                    loop.step()
            print(f"{loop.name}: profile summary in {path}", flush=True)


def run_megatron_rows(args: argparse.Namespace) -> dict[str, dict]:
    """Every Megatron row ``--megatron-repeats`` times, each time in a fresh process, the row
    order reversed on every other pass (drift hits every row alike); a row's windows are
    those of all its processes."""
    from benchmarks.train_throughput_megatron import megatron_rows, run_megatron_subprocess

    rows: dict[str, dict] = {}
    order = megatron_rows(args)
    with tempfile.TemporaryDirectory(prefix="hpcrl-bench-megatron-") as tmp:
        for repeat in range(args.megatron_repeats):
            for name, loop, attention in order if repeat % 2 == 0 else order[::-1]:
                out = Path(tmp) / f"{loop}-{attention}-{repeat}.json"
                result = run_megatron_subprocess(args, loop, attention, out)
                # each pass's figure as it ends: a call cut off by its time limit keeps them
                step_s = statistics.median(t for window in result["windows"] for t in window)
                print(f"{name} pass {repeat + 1}: {args.batch_size * args.seq_len / step_s:,.0f} "
                      f"tok/s (median step {step_s * 1e3:.1f} ms), first loss "
                      f"{result['first_loss']:.6f}, peak {result['peak_gib']:.1f} GiB", flush=True)  # fmt: skip
                if name not in rows:
                    rows[name] = result
                    continue
                if result["first_loss"] != rows[name]["first_loss"]:
                    print(f"{name}: first loss {result['first_loss']:.6f} in pass {repeat + 1}, "
                          f"{rows[name]['first_loss']:.6f} in pass 1", flush=True)  # fmt: skip
                rows[name]["windows"] += result["windows"]
                rows[name]["peak_gib"] = max(rows[name]["peak_gib"], result["peak_gib"])
    return rows


def megatron_child(args: argparse.Namespace, spec) -> None:
    from benchmarks.train_throughput_megatron import run_megatron

    (attention,) = args.megatron_attention
    result = run_megatron(args, spec, args.only, attention, time_windows_here(args, args.device))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # skip NCCL/gloo teardown at exit (megatron keeps group references)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec = model_spec(args.tiny)
    if args.only is not None:
        megatron_child(args, spec)
    started_s = time.perf_counter()
    rows: dict[str, dict] = {}
    if not args.skip_megatron:  # first, while this process has not touched the GPU
        rows.update(run_megatron_rows(args))
    megatron_s = time.perf_counter() - started_s
    batch = make_batch(spec.vocab_size or 256, args.batch_size, args.seq_len)
    loops = run_hf_loops(args, batch)
    hf_s = time.perf_counter() - started_s - megatron_s
    hf_rows = {
        name: {
            "windows": loop.windows,
            "first_loss": loop.first_loss,
            "peak_gib": loop.peak_gib,
            "last_loss": loop.last_loss,
        }
        for name, loop in loops.items()
    }
    print(
        f"device={args.device} batch={args.batch_size} seq={args.seq_len} rounds={args.rounds} "
        f"steps/round={args.steps} megatron_steps/window={args.megatron_steps} "
        f"megatron_repeats={args.megatron_repeats} "
        f"warmup={args.warmup} compile={not args.no_compile} torch={torch.__version__}"
    )
    flops = flops_per_token(spec, args.seq_len)
    report({**hf_rows, **rows}, args.batch_size * args.seq_len, flops, args.device)
    print(f"wall time {time.perf_counter() - started_s:.0f} s (Megatron rows {megatron_s:.0f} s, "
          f"HF rows {hf_s:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
