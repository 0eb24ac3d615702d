"""Benchmark: megatron-core optimizer CPU offload and TP/DP scaling on hpcrl's Megatron step.

A Llama-shaped GPTModel from megatron-core's local spec (no Transformer Engine needed), bf16
with the distributed optimizer (Adam), trained on random tokens through hpcrl's Megatron train
step (``hpcrl.core.backends.megatron.step``: vocab-parallel log-probs and
``get_forward_backward_func``). ``optimizer_cpu_offload`` with ``optimizer_offload_fraction=F``
moves that share of the optimizer state and its update to the host (HybridDeviceOptimizer).

One point (one process per rank; torchrun for more than one):

    python benchmarks/megatron_offload.py --fraction 0.5 --steps 10
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/megatron_offload.py --tp 2 --batch-size 8 --micro-batch-size 4

Drivers (each point in its own process group, so peaks do not mix):

    --sweep 0,0.25,0.5,1.0   offload fractions side by side on one GPU
    --scaling                tp1 (1 GPU), tp2, dp2, dp2+offload 0.5 overlap on/off (2 GPUs):
                             step s, tok/s, tok/s per GPU, peaks, loss vs tp1
    --sweep-dir DIR          the points of ``hpcrl sweep ... --no-submit -o DIR``: each point's
                             resolved recipe sets offload, batch and model; writes the point's
                             metrics.jsonl as the training core does, for ``hpcrl report DIR``

Initial weights equal at every TP size: ``use_cpu_initialization`` builds each full weight on
the CPU from one seeded generator (same draws in the same order on every rank) and keeps this
rank's slice (SwiGLU fc1 with stride 2), so TP=1 and TP=2 start from the same model.

Works with megatron-core 0.16 (Python 3.11) and 0.19 (Python 3.12, torch 2.11); no
megatron-bridge. ``--device cpu`` (gloo, hpcrl's CPU compatibility layer,
megatron-core 0.16) is a smoke run of the same code with a tiny model; offload needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

#: Set in every child: the GPU host forbids NVLink multicast (NVLS / symmetric memory).
CHILD_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
#: Flags passed from a driver to each point's process unchanged.
SHARED_FLAGS = ("steps", "warmup", "layers", "hidden", "heads", "ffn", "vocab", "seq_len",
                "batch_size", "micro_batch_size", "device", "seed", "lr", "attention")  # fmt: skip
OFFLOAD_KEY = "policy.megatron_cfg.optimizer"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fraction", type=float, default=0.0, help="0 = no offload")
    parser.add_argument("--overlap-d2h-h2d", action="store_true")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel size (tp*dp = ranks)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after warmup")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4, help="global batch (sequences)")
    parser.add_argument("--micro-batch-size", type=int, default=None, help="default: global/dp")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--attention", choices=("unfused", "sdpa"), default="unfused",
        help="core attention: megatron's local DotProductAttention (the raw loop) or hpcrl's "
        "SdpaCoreAttention (what the backend uses without Transformer Engine)",
    )  # fmt: skip
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json-out", default=None, help="write this point's result here")
    parser.add_argument("--metrics-out", default=None, help="append per-step metrics.jsonl here")
    parser.add_argument("--sweep", default=None, help="comma-separated fractions")
    parser.add_argument("--scaling", action="store_true", help="tp1/tp2/dp2/offload table")
    parser.add_argument("--sweep-dir", default=None, help="run an `hpcrl sweep --no-submit` dir")
    return parser.parse_args(argv)


def host_peak_rss_gb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


# --------------------------------------------------------------------------- one point
def init_distributed(device: str) -> None:
    """torchrun's environment, or a world of one; NCCL on GPUs, gloo + patches on CPU."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0")  # fmt: skip
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        return
    # megatron-core's CUDA-only calls, redirected (what a CPU job's worker does)
    from hpcrl.core.backends.megatron.cpu_compat import apply_for_process

    apply_for_process()
    dist.init_process_group("gloo")


def transformer_config(args: argparse.Namespace):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        ffn_hidden_size=args.ffn, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=args.tp, hidden_dropout=0.0, attention_dropout=0.0,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False,
        # Full weights drawn on the CPU, then sliced: the same model at every TP size.
        use_cpu_initialization=True,
    )  # fmt: skip


def gpt_model(args: argparse.Namespace, config, layer_spec):
    """The random-init GPTModel of ``args``' shape on ``layer_spec`` (train_throughput.py builds
    hpcrl's Megatron path on it too), on ``args.device``, bf16."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.module import Float16Module

    model = GPTModel(
        config=config, transformer_layer_spec=layer_spec,
        vocab_size=args.vocab, max_sequence_length=args.seq_len,
        position_embedding_type="rope", share_embeddings_and_output_weights=False,
    )  # fmt: skip
    if args.device == "cuda":
        model = model.cuda()
    # As megatron-bridge does for bf16: every param (norms too) in bf16, fp32 main copies in
    # the optimizer. Without it the torch norms keep fp32 params the offload path rejects.
    return Float16Module(config, model)


def build(args: argparse.Namespace):
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from hpcrl.core.backends.megatron.model import connect_grad_sync

    parallel_state.initialize_model_parallel(args.tp, 1)
    torch.manual_seed(args.seed)  # the CPU generator the initialisation draws from
    model_parallel_cuda_manual_seed(args.seed)
    config = transformer_config(args)
    layer_spec = get_gpt_layer_local_spec()
    if getattr(args, "attention", "unfused") == "sdpa":
        from hpcrl.core.backends.megatron.attention import sdpa_layer_spec

        layer_spec, _ = sdpa_layer_spec(layer_spec)
    model = gpt_model(args, config, layer_spec)
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
    chunks = [DistributedDataParallel(config=config, ddp_config=ddp, module=model)]
    offload = args.fraction > 0
    optimizer_config = OptimizerConfig(
        optimizer="adam", lr=args.lr, weight_decay=0.01, bf16=True,
        params_dtype=torch.bfloat16, use_distributed_optimizer=True, clip_grad=1.0,
        optimizer_cpu_offload=offload, optimizer_offload_fraction=args.fraction if offload else 0.0,
        overlap_cpu_optimizer_d2h_h2d=args.overlap_d2h_h2d and offload,
        use_precision_aware_optimizer=offload,
    )  # fmt: skip
    optimizer = get_megatron_optimizer(optimizer_config, chunks)
    connect_grad_sync(chunks, optimizer)
    return chunks, optimizer


def local_micro_batches(args: argparse.Namespace) -> tuple[list[dict], float]:
    """This DP rank's share of one fixed global batch, in micro-batches; global token count."""
    import torch
    from megatron.core import parallel_state

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), generator=generator)
    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), args.dp
    per_rank = args.batch_size // dp_size
    mine = input_ids[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    micro = args.micro_batch_size or per_rank
    batches = [{"input_ids": ids, "token_mask": torch.ones(ids.shape)} for ids in mine.split(micro)]
    return batches, float(args.batch_size * args.seq_len)


def check_layout(args: argparse.Namespace) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    micro = args.micro_batch_size or args.batch_size // args.dp
    problems = []
    if args.tp * args.dp != world:
        problems.append(f"--tp {args.tp} × --dp {args.dp} must equal the {world} ranks")
    if args.batch_size % (args.dp * micro):
        problems.append(f"--batch-size {args.batch_size} must split into dp × micro-batches")
    if problems:
        sys.exit("megatron_offload.py: " + "; ".join(problems))


def step_peaks(device: str) -> tuple[float | None, float]:
    """(max peak GPU GiB over ranks, summed peak host RSS GiB over ranks), on every rank."""
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    on = torch.device("cuda") if device == "cuda" else torch.device("cpu")
    peak = torch.tensor([gpu], dtype=torch.float64, device=on)
    rss = torch.tensor([host_peak_rss_gb()], dtype=torch.float64, device=on)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    dist.all_reduce(rss)
    return (float(peak) if device == "cuda" else None), float(rss)


def train_point(args: argparse.Namespace, on_step: Callable[[dict], None]) -> dict:
    """Warmup + timed steps; ``on_step`` gets each step's record (every rank)."""
    import torch

    from hpcrl.core.backends.megatron.step import run_train_microbatches

    chunks, optimizer = build(args)
    batches, num_tokens = local_micro_batches(args)
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    # on the device once (the worker uploads a step's micro-batches before this call)
    batches = [{key: value.to(device) for key, value in micro.items()} for micro in batches]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    step_times_s, losses = [], []
    for index in range(args.warmup + args.steps):
        sync()
        started = time.perf_counter()
        optimizer.zero_grad()
        metrics = run_train_microbatches(chunks, batches, masked_nll, num_tokens)
        _, grad_norm, _ = optimizer.step()
        sync()
        step_s = time.perf_counter() - started
        if index >= args.warmup:
            step_times_s.append(step_s)
        losses.append(metrics["loss"])
        gpu_gb, rss_gb = step_peaks(args.device)
        on_step(
            step_record(index + 1, metrics["loss"], grad_norm, num_tokens, step_s, gpu_gb, rss_gb)
        )
    return point_result(args, step_times_s, losses)


def masked_nll(logprobs, micro_batch, num_global_tokens):
    loss = -(logprobs * micro_batch["token_mask"]).sum() / num_global_tokens
    return loss, {}


def step_record(step: int, loss: float, grad_norm: float | None, num_tokens: float,
                step_s: float, peak_gpu_gb: float | None, peak_rss_gb: float) -> dict:  # fmt: skip
    """One metrics.jsonl record with the training core's keys (hpcrl.core.algorithms.sft and
    hpcrl.core.driver): what ``hpcrl report`` reads."""
    return {
        "step": step,
        "loss": loss,
        "grad_norm": grad_norm,
        "num_tokens": int(num_tokens),
        "num_loss_tokens": int(num_tokens),
        "tokens_per_s": num_tokens / step_s,
        "time_step_s": step_s,
        "time_train_s": step_s,
        "peak_gpu_mem_gb": peak_gpu_gb,
        "peak_host_rss_gb": peak_rss_gb,
        "peak_host_rss_driver_gb": peak_rss_gb,
    }


def point_result(args: argparse.Namespace, step_times_s: list[float], losses: list) -> dict:
    gpu_gb, rss_gb = step_peaks(args.device)
    step_s = statistics.median(step_times_s)
    world = args.tp * args.dp
    return {
        "fraction": args.fraction, "overlap_d2h_h2d": args.overlap_d2h_h2d,
        "tp": args.tp, "dp": args.dp, "gpus": world, "step_time_s": step_s,
        "tokens_per_s": args.batch_size * args.seq_len / step_s,
        "tokens_per_s_per_gpu": args.batch_size * args.seq_len / step_s / world,
        "peak_gpu_mem_gb": gpu_gb, "host_peak_rss_gb": rss_gb,
        "first_loss": losses[0], "last_loss": losses[-1], "losses": losses,
    }  # fmt: skip


def run_point(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    check_layout(args)
    init_distributed(args.device)
    rank0 = dist.get_rank() == 0
    writer = None
    if args.metrics_out and rank0:
        from hpcrl.run.metrics_file import MetricsWriter

        writer = MetricsWriter(args.metrics_out)
    result = train_point(args, writer.write if writer else (lambda record: None))
    if rank0:
        print(json.dumps(result), flush=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # skip NCCL/gloo teardown at exit (gloo can abort there)


# --------------------------------------------------------------------------- drivers
def child_command(args: argparse.Namespace, ranks: int, extra: list[str]) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(ranks), __file__]  # fmt: skip
    for name in SHARED_FLAGS:
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return command + extra


def run_child(args: argparse.Namespace, ranks: int, extra: list[str]) -> dict:
    """One point under torchrun with the GPU host's environment; its rank-0 result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = child_command(args, ranks, [*extra, "--json-out", str(out)])
        print("+ " + " ".join(command), flush=True)
        subprocess.run(command, check=True, env={**os.environ, **CHILD_ENV})
        return json.loads(out.read_text())


def fraction_sweep(args: argparse.Namespace) -> None:
    results = []
    for fraction in (float(f) for f in args.sweep.split(",")):
        extra = ["--fraction", str(fraction)] + (["--overlap-d2h-h2d"] * args.overlap_d2h_h2d)
        results.append(run_child(args, 1, extra))
    base = results[0]
    print(f"{'fraction':>8} {'step s':>8} {'× base':>7} {'GPU GiB':>8} {'× base':>7} "
          f"{'host GiB':>9} {'loss first→last':>18} {'max|Δloss| vs first':>20}")  # fmt: skip
    for r in results:
        diff = max(abs(a - b) for a, b in zip(r["losses"], base["losses"], strict=True))
        print(
            f"{r['fraction']:>8.2f} {r['step_time_s']:>8.3f} "
            f"{r['step_time_s'] / base['step_time_s']:>7.2f} {r['peak_gpu_mem_gb']:>8.2f} "
            f"{r['peak_gpu_mem_gb'] / base['peak_gpu_mem_gb']:>7.2f} "
            f"{r['host_peak_rss_gb']:>9.2f} {r['first_loss']:>8.3f}→{r['last_loss']:.3f} "
            f"{diff:>20.2e}"
        )


#: (name, ranks, flags) of the --scaling points; tp1 first: the others are compared to it.
SCALING_POINTS = (
    ("tp1", 1, []),
    ("tp2", 2, ["--tp", "2"]),
    ("dp2", 2, ["--dp", "2"]),
    ("dp2 off0.5 overlap", 2, ["--dp", "2", "--fraction", "0.5", "--overlap-d2h-h2d"]),
    ("dp2 off0.5 no-overlap", 2, ["--dp", "2", "--fraction", "0.5"]),
)


def scaling(args: argparse.Namespace) -> None:
    if args.micro_batch_size is None:  # same micro-batch shape at every layout
        args.micro_batch_size = max(1, args.batch_size // 2)
    # HybridDeviceOptimizer places state by param.is_cuda: no offload points on the CPU.
    points = [p for p in SCALING_POINTS if args.device == "cuda" or "--fraction" not in p[2]]
    rows = [(name, run_child(args, ranks, extra)) for name, ranks, extra in points]
    print(format_scaling_table(rows))


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def format_scaling_table(rows: list[tuple[str, dict]]) -> str:
    base = rows[0][1]
    header = (f"{'point':<22} {'GPUs':>4} {'step s':>7} {'tok/s':>9} {'tok/s/GPU':>9} "
              f"{'×tp1/GPU':>8} {'GPU GiB':>7} {'host GiB':>8} {'loss first→last':>17} "
              f"{'max|Δloss| vs tp1':>17}")  # fmt: skip
    lines = [header]
    for name, r in rows:
        diff = max(abs(a - b) for a, b in zip(r["losses"], base["losses"], strict=True))
        lines.append(
            f"{name:<22} {r['gpus']:>4} {r['step_time_s']:>7.3f} {r['tokens_per_s']:>9.0f} "
            f"{r['tokens_per_s_per_gpu']:>9.0f} "
            f"{r['tokens_per_s_per_gpu'] / base['tokens_per_s_per_gpu']:>8.2f} "
            f"{_gib(r['peak_gpu_mem_gb']):>7} {r['host_peak_rss_gb']:>8.2f} "
            f"{r['first_loss']:>8.4f}→{r['last_loss']:<8.4f} {diff:>17.2e}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.sweep_dir:
        from benchmarks.megatron_sweep_points import run_sweep_dir

        run_sweep_dir(args, run_child)
    elif args.scaling:
        scaling(args)
    elif args.sweep:
        fraction_sweep(args)
    else:
        run_point(args)


if __name__ == "__main__":
    main()
