"""Benchmark: the Automodel backend's train step vs a naive HF + FSDP2 loop, side by side.

Same weights (a random-init Llama-shaped ~1.1B model: 16 layers, hidden 2048, 16 heads, FFN
5632, vocab 32000), same batch (random tokens, batch 4 × seq 2048), same optimizer (AdamW),
one process (world 1). The backend runs through hpcrl's real worker class
(``TrainingWorker`` → ``AutomodelWorker``: chunked log-probs without full-vocab fp32 logits,
bf16 compute with fp32 master weights and reduction, per-block torch.compile, fused AdamW).
The naive loop is HF ``LlamaForCausalLM(labels=...)`` + ``fully_shard`` per block and root +
the same mixed precision + fused AdamW. Reported: tokens/s, MFU against 989 TFLOP/s counting
6·N (non-embedding) + 12·L·H·S attention per token (and with the lm_head, 6·V·H, added),
peak memory, and the backend/naive ratio. The two first-step losses are printed to show that
both loops compute the same loss.

Megatron rows (megatron-core only, no megatron-bridge needed; each loop in its own process):
the same shape, batch and optimizer (bf16 with fp32 main weights, distributed optimizer,
Adam(W) with weight decay 0.01, clip 1.0) on megatron-core's local layer spec (no Transformer
Engine). ``megatron-raw`` is ``benchmarks/megatron_offload.py``'s build at fraction 0 (plain
megatron-core objects). ``megatron`` is hpcrl's Megatron backend path: ``prepare_provider``
(local spec + SDPA core attention), ``build_model`` (megatron DDP), ``build_optimizer``,
``connect_grad_sync``, on a stand-in for the bridge's provider that builds the same random
GPTModel. Both train through ``step.run_train_microbatches`` and start from the same weights,
so their first losses agree. ``--megatron-attention sdpa,unfused`` adds a row with the
local spec's own attention on hpcrl's path (the swap's effect in the same run).

    python benchmarks/train_throughput.py --device cuda --steps 20
    python benchmarks/train_throughput.py --only megatron-raw          # one loop, this process
    python benchmarks/train_throughput.py --device cpu --tiny          # smoke test
"""

from __future__ import annotations

import argparse
import gc
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

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

PEAK_TFLOPS_H200_BF16 = 989.0
MEGATRON_LOOPS = ("megatron", "megatron-raw")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per loop")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--tiny", action="store_true", help="tiny Llama (CPU smoke test)")
    parser.add_argument("--no-compile", action="store_true", help="backend without compile")
    parser.add_argument("--only", choices=("backend", "naive", *MEGATRON_LOOPS), default=None)
    parser.add_argument("--megatron-steps", type=int, default=10, help="timed steps, megatron")
    parser.add_argument(
        "--megatron-attention",
        default="sdpa",
        help="core attention of the 'megatron' loop: sdpa (hpcrl's default without TE), "
        "unfused (the local spec's own), or both comma-separated (one row each)",
    )
    parser.add_argument("--json-out", default=None, help="(megatron loops) write the result here")
    args = parser.parse_args()
    args.megatron_attention = args.megatron_attention.split(",")
    if not set(args.megatron_attention) <= {"sdpa", "unfused"}:
        parser.error(f"--megatron-attention: sdpa, unfused or both, not {args.megatron_attention}")
    if args.tiny and args.seq_len == 2048:
        args.seq_len = 64
    return args


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


def time_steps(
    step: Callable[[], float], device: str, warmup: int, steps: int
) -> tuple[list[float], float, float]:
    """Per-step seconds of the timed steps, the first loss, peak memory GiB."""
    first_loss = step()
    for _ in range(warmup - 1):
        step()
    synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return times, first_loss, peak_gib


def make_recipe(
    model_path: str,
    args: argparse.Namespace,
    *,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    lr: float = 1e-5,
    dp_replicate: int = 1,
):
    """The benchmark's SFT recipe; the batch defaults to ``--batch-size`` in one micro-batch
    (scaling_automodel.py passes its own batch, lr and HSDP replicas)."""
    from hpcrl.config.recipe import (
        AutomodelCfg,
        DataCfg,
        OptimizerCfg,
        PolicyCfg,
        Recipe,
        SftCfg,
    )

    global_batch = args.batch_size if global_batch is None else global_batch
    return Recipe(
        policy=PolicyCfg(
            model_name=model_path,
            train_global_batch_size=global_batch,
            train_micro_batch_size=global_batch if micro_batch is None else micro_batch,
            precision="bfloat16" if args.device == "cuda" else "float32",
            max_grad_norm=1.0,
            optimizer=OptimizerCfg(name="torch.optim.AdamW", kwargs={"lr": lr}),
            automodel_cfg=AutomodelCfg(
                enabled=True, dp_replicate_size=dp_replicate, torch_compile=not args.no_compile
            ),
        ),
        data=DataCfg(train_path="unused.jsonl"),
        sft=SftCfg(max_num_steps=args.steps + args.warmup),
    )


def start_backend(model_path: str, args: argparse.Namespace):
    """hpcrl's worker for rank 0 of a world of 1 (it creates the process group)."""
    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.backends.base import RankInfo
    from hpcrl.core.workers.actor import TrainingWorker
    from hpcrl.core.workers.group import worker_env

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = TrainingWorker(worker_class_path("automodel"), worker_env(args.device))
    rank_info = RankInfo(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
        device=args.device,
    )
    worker.setup(make_recipe(model_path, args), rank_info, model_path, os.cpu_count() or 1)
    return worker


def close_backend(backend: object) -> None:
    backend.close()


def run_backend(worker, batch: dict, args: argparse.Namespace) -> tuple[list[float], float, float]:
    num_tokens = float(batch["token_mask"].sum())

    def step() -> float:
        return worker.train(batch, nll_loss, num_tokens, args.batch_size)["loss"]

    try:
        return time_steps(step, args.device, args.warmup, args.steps)
    finally:
        worker.run(close_backend)


def free_memory(device: str) -> None:
    """Drop what the previous loop left (compiled graphs hold on to their modules)."""
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        left_gib = torch.cuda.memory_allocated() / 2**30
        print(f"GPU memory still allocated before the next loop: {left_gib:.2f} GiB")


def run_naive(model_path: str, batch: dict, args: argparse.Namespace):
    """HF forward with labels (full-vocab logits), FSDP2 per block + root, fused AdamW."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation="sdpa"
    ).to(args.device)
    mp = {}
    if args.device == "cuda":
        mp["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    for layer in model.model.layers:
        fully_shard(layer, **mp)
    fully_shard(model, **mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=args.device == "cuda" or None)
    input_ids = batch["input_ids"].to(args.device)
    mask = batch["attention_mask"].to(args.device)

    def step() -> float:
        loss = model(
            input_ids=input_ids, attention_mask=mask, labels=input_ids, use_cache=False
        ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return time_steps(step, args.device, args.warmup, args.steps)  # model dies with this frame


# --------------------------------------------------------------------------- Megatron loops
def model_spec(tiny: bool):
    from hpcrl.core.models.tiny import TINY_SPECS

    return TINY_SPECS["llama" if tiny else "llama-1b"]


def megatron_args(args: argparse.Namespace) -> argparse.Namespace:
    """``benchmarks/megatron_offload.py``'s settings for this shape and batch (fraction 0)."""
    spec = model_spec(args.tiny)
    return argparse.Namespace(
        layers=spec.num_hidden_layers, hidden=spec.hidden_size, heads=spec.num_attention_heads,
        ffn=spec.intermediate_size, vocab=spec.vocab_size or 256, seq_len=args.seq_len,
        batch_size=args.batch_size, micro_batch_size=None, tp=1, dp=1, seed=1234, lr=1e-5,
        fraction=0.0, overlap_d2h_h2d=False, device=args.device,
    )  # fmt: skip


class RandomGptProvider:
    """Stands in for megatron-bridge's GPT provider (the GPU machine has no bridge wheel).

    ``prepare_provider`` sets its fields on it as on the real one (layer spec, parallel sizes,
    dtypes); ``provide_distributed_model`` builds the raw loop's random GPTModel on the layer
    spec that ``prepare_provider`` chose. (Shape and dtypes come from ``megatron_args``.)
    """

    def __init__(self, shape: argparse.Namespace) -> None:
        self.shape = shape
        self.transformer_layer_spec = None

    def provide_distributed_model(self, **_kwargs) -> list:
        from benchmarks import megatron_offload

        config = megatron_offload.transformer_config(self.shape)
        return [megatron_offload.gpt_model(self.shape, config, self.transformer_layer_spec)]


def build_hpcrl_megatron(shape: argparse.Namespace, attention: str) -> tuple[list, object]:
    """Model chunks and optimizer through the Megatron worker's own setup functions."""
    from hpcrl.config.recipe import DistributedDataParallelCfg, MegatronCfg, MegatronOptimizerCfg
    from hpcrl.core.backends.megatron import model as mcore_model
    from hpcrl.core.backends.megatron.provider import prepare_provider

    overrides = {}
    if attention == "unfused":  # a user override of the spec wins over hpcrl's SDPA swap
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        overrides["transformer_layer_spec"] = get_gpt_layer_local_spec()
    cfg = MegatronCfg(
        enabled=True,
        optimizer=MegatronOptimizerCfg(
            optimizer="adam", lr=shape.lr, weight_decay=0.01, params_dtype="bfloat16",
            use_distributed_optimizer=True, clip_grad=1.0,
        ),
        distributed_data_parallel_config=DistributedDataParallelCfg(grad_reduce_in_fp32=True),
        model_overrides=overrides,
    )  # fmt: skip
    mcore_model.initialize_parallel_state(cfg, seed=shape.seed)
    provider = RandomGptProvider(shape)
    prepare_provider(provider, cfg, "bfloat16", shape.seq_len)
    torch.manual_seed(shape.seed)  # the CPU generator the initialisation draws from (as raw)
    chunks = mcore_model.build_model(provider, cfg, on_cpu=shape.device == "cpu")
    optimizer = mcore_model.build_optimizer(chunks, cfg, "bfloat16")
    mcore_model.connect_grad_sync(chunks, optimizer)
    return chunks, optimizer


def run_megatron(args: argparse.Namespace, loop: str, attention: str):
    """One Megatron loop in this process: (step times, first loss, peak GiB)."""
    from benchmarks import megatron_offload
    from hpcrl.core.backends.megatron.step import run_train_microbatches

    shape = megatron_args(args)
    megatron_offload.init_distributed(args.device)
    if loop == "megatron-raw":
        chunks, optimizer = megatron_offload.build(shape)
    else:
        chunks, optimizer = build_hpcrl_megatron(shape, attention)
    kinds = {type(m).__name__ for n, m in chunks[0].named_modules() if n.endswith("core_attention")}
    print(f"{loop}: core attention {sorted(kinds)}", flush=True)
    batch = make_batch(shape.vocab, args.batch_size, args.seq_len)
    num_tokens = float(batch["token_mask"].sum())

    def step() -> float:
        optimizer.zero_grad()
        metrics = run_train_microbatches(chunks, [batch], nll_loss, num_tokens)
        optimizer.step()
        return metrics["loss"]

    return time_steps(step, args.device, args.warmup, args.megatron_steps)


def megatron_rows(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(row name, loop, attention) of the Megatron loops this run asks for."""
    rows = []
    for attention in args.megatron_attention:
        name = "megatron" if attention == "sdpa" else f"megatron[{attention}]"
        rows.append((name, "megatron", attention))
    return [*rows, ("megatron-raw", "megatron-raw", "unfused")]


def run_megatron_subprocess(args: argparse.Namespace, loop: str, attention: str, out: Path):
    """One Megatron loop in a fresh process (clean GPU memory, its own process group)."""
    command = [
        sys.executable, __file__, "--only", loop, "--megatron-attention", attention,
        "--device", args.device, "--batch-size", str(args.batch_size),
        "--seq-len", str(args.seq_len), "--warmup", str(args.warmup),
        "--megatron-steps", str(args.megatron_steps), "--json-out", str(out),
    ]  # fmt: skip
    subprocess.run(command + (["--tiny"] if args.tiny else []), check=True)
    result = json.loads(out.read_text())
    return result["times"], result["first_loss"], result["peak_gib"]


# --------------------------------------------------------------------------- report
def flops_per_token(spec, seq_len: int) -> tuple[float, float]:
    """(6·N_non_embedding + 12·L·H·S, the same plus the lm_head's 6·V·H)."""
    hidden, layers, ffn = spec.hidden_size, spec.num_hidden_layers, spec.intermediate_size
    head_dim = hidden // spec.num_attention_heads
    kv = spec.num_key_value_heads * head_dim
    per_layer = hidden * hidden * 2 + hidden * kv * 2 + 3 * hidden * ffn + 2 * hidden
    non_embedding = layers * per_layer + hidden
    base = 6 * non_embedding + 12 * layers * hidden * seq_len
    return float(base), float(base + 6 * (spec.vocab_size or 256) * hidden)


def report(results: dict, tokens_per_step: int, flops: tuple[float, float], device: str) -> None:
    print(
        f"\n{'loop':<18} {'tok/s':>10} {'MFU':>7} {'MFU+lm':>7} {'peak GiB':>9} {'first loss':>11}"
    )
    rates = {}
    for name, (times, first_loss, peak_gib) in results.items():
        rates[name] = tokens_per_step / statistics.median(times)
        if device == "cuda":
            mfu = [rates[name] * f / (PEAK_TFLOPS_H200_BF16 * 1e12) for f in flops]
            mfu_text = f"{mfu[0]:>6.1%} {mfu[1]:>6.1%}"
        else:
            mfu_text = f"{'n/a':>7} {'n/a':>7}"
        print(f"{name:<18} {rates[name]:>10,.0f} {mfu_text} {peak_gib:>9.1f} {first_loss:>11.4f}")
    print()
    megatron = [name for name in rates if name.startswith("megatron") and name != "megatron-raw"]
    for name, base in [("backend", "naive"), *((name, "megatron-raw") for name in megatron)]:
        if name in rates and base in rates:
            print(f"{name} / {base} tokens/s: {rates[name] / rates[base]:.2f}x")


def run_hf_loops(args: argparse.Namespace, batch: dict) -> dict:
    """The Automodel backend and the naive loop, one after the other in this process."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="hpcrl-bench-") as tmp:
        model_path = build_checkpoint(args.tiny, tmp)
        worker = start_backend(model_path, args)  # also the process group the naive loop uses
        try:
            if args.only == "naive":
                worker.run(close_backend)
            else:
                results["backend"] = run_backend(worker, batch, args)
            free_memory(args.device)
            if args.only != "backend":
                results["naive"] = run_naive(model_path, batch, args)
                free_memory(args.device)
        finally:
            worker.close()
    return results


def main() -> None:
    args = parse_args()
    spec = model_spec(args.tiny)
    flops = flops_per_token(spec, args.seq_len)
    results = {}
    if args.only in MEGATRON_LOOPS:
        (attention,) = args.megatron_attention
        times, first_loss, peak_gib = run_megatron(args, args.only, attention)
        if args.json_out:
            Path(args.json_out).write_text(
                json.dumps({"times": times, "first_loss": first_loss, "peak_gib": peak_gib})
            )
        name = megatron_rows(args)[0][0] if args.only == "megatron" else args.only
        report({name: (times, first_loss, peak_gib)}, args.batch_size * args.seq_len, flops,
               args.device)  # fmt: skip
        sys.stdout.flush()
        os._exit(0)  # skip NCCL/gloo teardown at exit (megatron keeps group references)
    if args.only is None:  # first, while this process has not touched the GPU
        with tempfile.TemporaryDirectory(prefix="hpcrl-bench-megatron-") as tmp:
            for name, loop, attention in megatron_rows(args):
                out = Path(tmp) / f"{loop}-{attention}.json"
                results[name] = run_megatron_subprocess(args, loop, attention, out)
    batch = make_batch(spec.vocab_size or 256, args.batch_size, args.seq_len)
    results = {**run_hf_loops(args, batch), **results}
    print(
        f"device={args.device} batch={args.batch_size} seq={args.seq_len} steps={args.steps} "
        f"megatron_steps={args.megatron_steps} warmup={args.warmup} "
        f"compile={not args.no_compile} torch={torch.__version__}"
    )
    report(results, args.batch_size * args.seq_len, flops, args.device)


if __name__ == "__main__":
    main()
