"""Benchmark: megatron-core optimizer CPU offload (HybridDeviceOptimizer) at fraction F.

One GPU, world 1: a Llama-shaped GPTModel from megatron-core's local spec (no Transformer
Engine needed), bf16 with the distributed optimizer (Adam), trained on random tokens through
hpcrl's Megatron train step (``hpcrl.core.backends.megatron.step``: vocab-parallel log-probs
and ``get_forward_backward_func``). ``optimizer_cpu_offload`` with
``optimizer_offload_fraction=F`` moves that share of the optimizer state and its update to
the host. Reported per fraction: median step time, peak GPU memory, peak host RSS.

    python benchmarks/megatron_offload.py --fraction 0.5 --steps 10
    python benchmarks/megatron_offload.py --sweep 0,0.25,0.5,1.0 --steps 10   # side by side

Works with megatron-core 0.16 (Python 3.11) and 0.19 (Python 3.12, torch 2.11); megatron-bridge
is not needed. Each sweep point runs in its own process so peaks do not mix.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fraction", type=float, default=0.0, help="optimizer_offload_fraction; 0 = no offload"
    )
    parser.add_argument(
        "--sweep", default=None, help="comma-separated fractions, each in its own process"
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--overlap-d2h-h2d", action="store_true")
    parser.add_argument("--json-out", default=None, help="write this point's result here")
    return parser.parse_args()


def host_peak_rss_gb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def init_single_rank() -> None:
    import torch
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)


def build(args: argparse.Namespace):
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    from hpcrl.core.backends.megatron.model import connect_grad_sync

    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        ffn_hidden_size=args.ffn,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=args.vocab,
        max_sequence_length=args.seq_len,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    ).cuda()
    # As megatron-bridge does for bf16: every param (norms too) in bf16, fp32 main copies in
    # the optimizer. Without it the torch norms keep fp32 params the offload path rejects.
    model = Float16Module(config, model)
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
    chunks = [DistributedDataParallel(config=config, ddp_config=ddp, module=model)]
    offload = args.fraction > 0
    opt_kwargs = dict(
        optimizer="adam",
        lr=1e-5,
        weight_decay=0.01,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
        clip_grad=1.0,
        optimizer_cpu_offload=offload,
        optimizer_offload_fraction=args.fraction if offload else 0.0,
        overlap_cpu_optimizer_d2h_h2d=args.overlap_d2h_h2d and offload,
        use_precision_aware_optimizer=offload,
    )
    optimizer = get_megatron_optimizer(OptimizerConfig(**opt_kwargs), chunks)
    connect_grad_sync(chunks, optimizer)
    return chunks, optimizer


def masked_nll(logprobs, micro_batch, num_global_tokens):
    loss = -(logprobs * micro_batch["token_mask"]).sum() / num_global_tokens
    return loss, {}


def run_point(args: argparse.Namespace) -> dict:
    import torch

    from hpcrl.core.backends.megatron.step import run_train_microbatches

    init_single_rank()
    chunks, optimizer = build(args)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), generator=generator)
    batch = {"input_ids": input_ids, "token_mask": torch.ones(input_ids.shape)}
    num_tokens = float(batch["token_mask"].sum())
    step_times_s, losses = [], []
    for index in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        optimizer.zero_grad()
        metrics = run_train_microbatches(chunks, [batch], masked_nll, num_tokens)
        optimizer.step()
        torch.cuda.synchronize()
        if index >= args.warmup:
            step_times_s.append(time.perf_counter() - started)
        losses.append(metrics["loss"])
    return {
        "fraction": args.fraction,
        "step_time_s": statistics.median(step_times_s),
        "tokens_per_s": args.batch_size * args.seq_len / statistics.median(step_times_s),
        "peak_gpu_mem_gb": torch.cuda.max_memory_allocated() / 2**30,
        "host_peak_rss_gb": host_peak_rss_gb(),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def sweep(args: argparse.Namespace) -> None:
    fractions = [float(f) for f in args.sweep.split(",")]
    results = []
    for fraction in fractions:
        out = Path(f"/tmp/megatron_offload_{os.getpid()}_{fraction}.json")
        command = [sys.executable, __file__, "--fraction", str(fraction), "--json-out", str(out)]
        for name in (
            "steps",
            "warmup",
            "layers",
            "hidden",
            "heads",
            "ffn",
            "vocab",
            "seq_len",
            "batch_size",
        ):
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        if args.overlap_d2h_h2d:
            command.append("--overlap-d2h-h2d")
        subprocess.run(command, check=True)
        results.append(json.loads(out.read_text()))
    base = results[0]
    print(
        f"{'fraction':>8} {'step s':>8} {'× base':>7} {'GPU GiB':>8} {'× base':>7} {'host GiB':>9} {'loss first→last':>18}"
    )
    for r in results:
        print(
            f"{r['fraction']:>8.2f} {r['step_time_s']:>8.3f} {r['step_time_s'] / base['step_time_s']:>7.2f} "
            f"{r['peak_gpu_mem_gb']:>8.2f} {r['peak_gpu_mem_gb'] / base['peak_gpu_mem_gb']:>7.2f} "
            f"{r['host_peak_rss_gb']:>9.2f} {r['first_loss']:>8.3f}→{r['last_loss']:.3f}"
        )


def main() -> None:
    args = parse_args()
    if args.sweep:
        sweep(args)
        return
    result = run_point(args)
    print(json.dumps(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # skip NCCL/gloo teardown at exit


if __name__ == "__main__":
    main()
