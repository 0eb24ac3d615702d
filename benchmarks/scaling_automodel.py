"""Benchmark: the Automodel backend on several GPUs (FSDP2, HSDP) against one GPU, side by side.

One command runs every parallel layout ("config") as its own ``torch.distributed.run`` job,
one after the other, then prints per-step losses next to each other and a throughput table.
Every config trains the same random-init checkpoint (written once by this process) on the
same global batch (``--global-batch`` rows of ``--seq-len`` random tokens, the same batch
every step, so the loss falls and the optimizer updates are part of the comparison). One GPU
runs the batch as micro-batches; N GPUs split it by data-parallel rank with hpcrl's own
``split_batch`` and run their share as micro-batches. Each rank goes through hpcrl's real
classes, as ``train_throughput.py`` does: ``TrainingWorker`` (process group, micro-batch split)
→ ``AutomodelWorker`` (mesh from ``policy.automodel_cfg.dp_replicate_size``: plain FSDP2 when
1, HSDP replicate × shard when > 1).

Configs: ``1`` (one GPU, no FSDP), ``fsdpN`` (N GPUs, one FSDP2 shard group), ``hsdpRxS``
(R replicas × S shards on R·S GPUs; ``hsdp2x1`` exercises the HSDP path on 2 GPUs).
Reported per config: tokens/s total and per GPU, MFU per GPU under both attention
conventions (``benchmarks/mfu.py``: full and causal attention, each with and without the
lm_head, against 989 TFLOP/s), peak GPU memory (max over ranks), scaling efficiency
(tok/s per GPU at N / tok/s of config ``1``), and the largest relative loss difference from
config ``1`` (within ``--rtol``: bf16 on GPU, fp32 on CPU).

    python3 benchmarks/scaling_automodel.py --device cuda --configs 1,fsdp2,hsdp2x1 --steps 10
    python3 benchmarks/scaling_automodel.py --device cpu --tiny --configs 1,fsdp2,hsdp2x1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

REPO_ROOT = Path(__file__).resolve().parent.parent
# The GPU host's rule: NVLink multicast (NVLS / symmetric-memory multicast) stays off.
MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
CONFIG_PATTERN = re.compile(
    r"^(?:(?P<single>1)|fsdp(?P<fsdp>\d+)|hsdp(?P<rep>\d+)x(?P<shard>\d+))$"
)
DEFAULT_RTOL = {"cuda": 2e-2, "cpu": 1e-5}  # bf16 compute vs fp32 throughout


@attrs.frozen(kw_only=True)
class ParallelConfig:
    """One layout: its name, how many ranks, how many HSDP replicas."""

    name: str
    world_size: int
    dp_replicate: int

    @property
    def dp_shard(self) -> int:
        return self.world_size // self.dp_replicate


def parse_config(name: str) -> ParallelConfig:
    match = CONFIG_PATTERN.match(name)
    if match is None:
        raise SystemExit(
            f"--configs: unknown config {name!r}; valid forms are 1, fsdpN (e.g. fsdp2) and "
            "hsdpRxS (R replicas x S shards, e.g. hsdp2x1, hsdp2x2)"
        )
    if match["single"]:
        return ParallelConfig(name=name, world_size=1, dp_replicate=1)
    if match["fsdp"]:
        return ParallelConfig(name=name, world_size=int(match["fsdp"]), dp_replicate=1)
    replicas, shards = int(match["rep"]), int(match["shard"])
    return ParallelConfig(name=name, world_size=replicas * shards, dp_replicate=replicas)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--configs", default="1,fsdp2,hsdp2x1", help="comma-separated layouts")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile)")
    parser.add_argument("--micro-batch", type=int, default=4, help="rows per forward/backward")
    parser.add_argument(
        "--global-batch", type=int, default=None, help="rows per step (default: micro × max N)"
    )
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument(
        "--lr", type=float, default=None, help="AdamW lr (default 1e-5; 1e-3 with --tiny)"
    )
    parser.add_argument("--tiny", action="store_true", help="tiny Llama (CPU smoke test)")
    parser.add_argument("--no-compile", action="store_true", help="no per-block torch.compile")
    parser.add_argument("--rtol", type=float, default=None, help="loss parity tolerance")
    parser.add_argument("--config-timeout-s", type=float, default=180.0, help="per config")
    parser.add_argument("--json-out", default=None, help="folder for per-config JSON results")
    # Set by the parent for the torchrun children only.
    parser.add_argument("--child-config", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny and args.seq_len == 2048:
        args.seq_len = 64
    if args.lr is None:
        # The tiny model barely moves at 1e-5; a falling loss makes the parity check bite.
        args.lr = 1e-3 if args.tiny else 1e-5
    if args.rtol is None:
        args.rtol = DEFAULT_RTOL[args.device]
    return args


# ---------------------------------------------------------------------------- child (one rank)
def pin_local_gpu() -> None:
    """One visible GPU per rank, as Ray gives each actor (``TrainingWorker`` uses cuda:0)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    local_rank = int(os.environ["LOCAL_RANK"])
    devices = visible.split(",") if visible else [str(i) for i in range(local_rank + 1)]
    os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank]


def make_recipe(args: argparse.Namespace, config: ParallelConfig, model_path: str):
    from train_throughput import make_recipe as benchmark_recipe

    return benchmark_recipe(
        model_path,
        args,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        lr=args.lr,
        dp_replicate=config.dp_replicate,
        num_steps=args.steps + args.warmup,
    )


def start_worker(args: argparse.Namespace, config: ParallelConfig):
    """hpcrl's rank worker on the process group that torchrun describes in the environment."""
    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.backends.base import RankInfo
    from hpcrl.core.workers.actor import TrainingWorker
    from hpcrl.core.workers.group import worker_env

    world_size = int(os.environ["WORLD_SIZE"])
    assert world_size == config.world_size, f"{config.name} needs {config.world_size} ranks"
    rank_info = RankInfo(
        rank=int(os.environ["RANK"]),
        world_size=world_size,
        local_rank=int(os.environ["LOCAL_RANK"]),
        local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
        node_rank=0,
        master_addr=os.environ["MASTER_ADDR"],
        master_port=int(os.environ["MASTER_PORT"]),
        device=args.device,
    )
    worker = TrainingWorker(worker_class_path("automodel"), worker_env(args.device))
    # CPU smoke test only (GPU ranks ignore it): one intra-op thread per rank, because
    # more threads than free cores made a 1-rank step 30x slower on the shared 2-core box.
    threads = 1
    place = worker.setup(
        make_recipe(args, config, args.model_path), rank_info, args.model_path, threads
    )
    return worker, place


def my_shard(args: argparse.Namespace, place) -> dict:
    """This rank's rows of the global batch, split exactly as ``RayPolicy.train`` splits it."""
    from train_throughput import make_batch

    from hpcrl.core.models.tiny import TINY_SPECS
    from hpcrl.core.workers.sharding import split_batch

    spec = TINY_SPECS["llama" if args.tiny else "llama-1b"]
    batch = make_batch(spec.vocab_size or 256, args.global_batch, args.seq_len)
    shards = split_batch(batch, place.dp_size, "--global-batch")
    return {"shard": shards[place.dp_rank], "num_tokens": float(batch["token_mask"].sum())}


def timed_training(args: argparse.Namespace, worker, place) -> dict:
    """Losses of every step (warmup included) and seconds of the timed steps."""
    import torch
    from train_throughput import fixed_plan, nll_loss, synchronize

    data = my_shard(args, place)
    shard_rows, width = data["shard"]["input_ids"].shape
    plan = fixed_plan(shard_rows, args.micro_batch, width)
    losses, step_times_s = [], []
    warmup_started = time.perf_counter()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            synchronize(args.device)
            warmup_s = time.perf_counter() - warmup_started
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        # The metrics come back after an all-reduce, so every rank has finished the step.
        metrics = worker.train(data["shard"], nll_loss, data["num_tokens"], plan)
        synchronize(args.device)
        step_times_s.append(time.perf_counter() - started)
        losses.append(metrics["loss"])
    return {"losses": losses, "step_times_s": step_times_s[args.warmup :], "warmup_s": warmup_s}


def max_peak_memory_gib(device: str) -> float:
    """Largest peak allocated memory over all ranks (NaN on CPU)."""
    import torch
    import torch.distributed as dist

    if device != "cuda":
        return float("nan")
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return float(peak.item())


def run_child(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        pin_local_gpu()
    import torch

    config = parse_config(args.child_config)
    started = time.perf_counter()
    worker, place = start_worker(args, config)
    setup_s = time.perf_counter() - started
    try:
        result = timed_training(args, worker, place)
        result["peak_gib"] = max_peak_memory_gib(args.device)
    finally:
        worker.close()
    if int(os.environ["RANK"]) == 0:
        result.update(
            config=config.name,
            world_size=config.world_size,
            dp_replicate=config.dp_replicate,
            dp_shard=config.dp_shard,
            dp_size=place.dp_size,
            setup_s=setup_s,
            torch=torch.__version__,
        )
        out_path = Path(args.json_out) / f"{config.name}.json"
        out_path.write_text(json.dumps(result, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's threads can abort the interpreter at exit after destroy_process_group
    # (training-stack-facts, trap 2); everything is written, so leave without teardown.
    os._exit(0)


# ---------------------------------------------------------------------------- parent (driver)
def child_env() -> dict[str, str]:
    env = dict(os.environ, **MULTICAST_OFF_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, said out loud; setup overrides
    return env


def child_command(args: argparse.Namespace, config: ParallelConfig, model_path: str, out_dir: str):
    forwarded = [
        f"--device={args.device}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--micro-batch={args.micro_batch}",
        f"--global-batch={args.global_batch}",
        f"--seq-len={args.seq_len}",
        f"--lr={args.lr}",
        f"--json-out={out_dir}",
        f"--child-config={config.name}",
        f"--model-path={model_path}",
    ]
    forwarded += ["--tiny"] * args.tiny + ["--no-compile"] * args.no_compile
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += [f"--nproc-per-node={config.world_size}"]
    return [*launcher, str(Path(__file__).resolve()), *forwarded]


def launch(args: argparse.Namespace, config: ParallelConfig, model_path: str, out_dir: str) -> dict:
    """Run one config to completion; a failure or timeout becomes a result with an error."""
    out_path = Path(out_dir) / f"{config.name}.json"
    out_path.unlink(missing_ok=True)
    print(
        f"\n=== {config.name}: {config.world_size} rank(s), "
        f"{config.dp_replicate} replica(s) x {config.dp_shard} shard(s) ===",
        flush=True,
    )
    started = time.perf_counter()
    # Own session: on timeout the whole torchrun tree is killed by its process-group id.
    proc = subprocess.Popen(
        child_command(args, config, model_path, out_dir), env=child_env(), start_new_session=True
    )
    try:
        returncode = proc.wait(timeout=args.config_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        returncode = f"timed out after {args.config_timeout_s:.0f} s"
    wall_s = time.perf_counter() - started
    if returncode != 0 or not out_path.exists():
        return {"config": config.name, "error": f"exit {returncode}", "wall_s": wall_s}
    return {**json.loads(out_path.read_text()), "wall_s": wall_s}


def check_devices(args: argparse.Namespace, configs: list[ParallelConfig]) -> None:
    import torch

    needed = max(c.world_size for c in configs)
    if args.device == "cuda" and torch.cuda.device_count() < needed:
        raise SystemExit(
            f"--configs needs {needed} GPUs but {torch.cuda.device_count()} are visible; "
            "drop the larger configs or run on a machine with more GPUs"
        )
    if args.global_batch % args.micro_batch or any(
        args.global_batch % c.world_size for c in configs
    ):
        raise SystemExit(
            f"--global-batch {args.global_batch} must be a multiple of --micro-batch "
            f"{args.micro_batch} and of every config's GPU count"
        )


def print_losses(results: list[dict], rtol: float) -> bool:
    """Per-step losses side by side; True when every config is within ``rtol`` of ``1``."""
    done = [r for r in results if "losses" in r]
    if not done:
        return False
    print("\nper-step loss (same weights, same global batch every step; warmup steps included)")
    print(f"{'step':>4} " + " ".join(f"{r['config']:>12}" for r in done))
    for step in range(len(done[0]["losses"])):
        print(f"{step:>4} " + " ".join(f"{r['losses'][step]:>12.6f}" for r in done))
    reference = next((r for r in done if r["config"] == "1"), None)
    if reference is None:
        print("no config '1' to compare against: loss parity not checked")
        return True
    # Why bf16 runs differ at all: config 1 runs without FSDP (fp32 weights under autocast,
    # fp32 residual stream); N ranks use FSDP mixed precision (bf16 parameters).
    parity_ok = True
    for result in done:
        if result is reference:
            continue
        diffs = [
            abs(a - b) / abs(b) for a, b in zip(result["losses"], reference["losses"], strict=True)
        ]
        within = max(diffs) <= rtol
        parity_ok &= within
        verdict = "OK" if within else "FAIL"
        print(
            f"max relative loss difference {result['config']} vs 1: {max(diffs):.2e} "
            f"(rtol {rtol:.0e}) {verdict}"
        )
    return parity_ok


def peak_text(peak_gib: float) -> str:
    return f"{'n/a':>8}" if peak_gib != peak_gib else f"{peak_gib:>8.1f}"  # NaN on CPU


def throughput_row(r: dict, rate: float, single_rate: float | None, mfu_text: str):
    per_gpu = rate / r["world_size"]
    scaling = f"{per_gpu / single_rate:>7.2f}" if single_rate else f"{'n/a':>7}"
    layout = f"{r['dp_replicate']}×{r['dp_shard']}"
    step_s = statistics.median(r["step_times_s"])
    times = f"{step_s:>6.3f} {r['setup_s']:>7.1f} {r['warmup_s']:>8.1f} {r['wall_s']:>6.1f}"
    return (
        f"{r['config']:<9} {r['world_size']:>4} {layout:>9} {rate:>10,.0f} {per_gpu:>10,.0f} "
        f"{mfu_text} {peak_text(r['peak_gib'])} {scaling} {times}"
    )


def print_throughput(results: list[dict], args: argparse.Namespace, flops: dict[str, float]):
    """Median-step rates; MFU per GPU; scaling = tok/s per GPU over config ``1``'s tok/s."""
    from mfu import LEGEND, PEAK_TFLOPS_H200_BF16, mfu_cells, mfu_header

    tokens_per_step = args.global_batch * args.seq_len
    single = next((r for r in results if r["config"] == "1" and "step_times_s" in r), None)
    single_rate = tokens_per_step / statistics.median(single["step_times_s"]) if single else None
    print(
        f"\n{'config':<9} {'GPUs':>4} {'rep×shard':>9} {'tok/s':>10} {'tok/s/GPU':>10} "
        f"{mfu_header()} {'peak GiB':>8} {'scaling':>7} {'step s':>6} {'setup s':>7} "
        f"{'warmup s':>8} {'wall s':>6}"
    )
    for r in results:
        if "step_times_s" not in r:
            print(f"{r['config']:<9} FAILED ({r['error']}, {r['wall_s']:.0f} s)")
            continue
        rate = tokens_per_step / statistics.median(r["step_times_s"])
        per_gpu = rate / r["world_size"]
        mfu_text = mfu_cells(per_gpu, flops, args.device, PEAK_TFLOPS_H200_BF16)
        print(throughput_row(r, rate, single_rate, mfu_text))
    print(LEGEND.format(peak=PEAK_TFLOPS_H200_BF16) + " MFU is per GPU.")


def run_parent(args: argparse.Namespace) -> int:
    from mfu import flops_per_token
    from train_throughput import build_checkpoint, model_spec

    configs = [parse_config(name) for name in args.configs.split(",") if name]
    if args.global_batch is None:
        args.global_batch = args.micro_batch * max(c.world_size for c in configs)
    check_devices(args, configs)
    out_dir = args.json_out or tempfile.mkdtemp(prefix="hpcrl-scaling-")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hpcrl-scaling-model-") as model_dir:
        started = time.perf_counter()
        model_path = build_checkpoint(args.tiny, model_dir)
        print(
            f"random-init checkpoint written in {time.perf_counter() - started:.1f} s", flush=True
        )
        flops = flops_per_token(model_spec(args.tiny), args.seq_len)
        results = [launch(args, config, model_path, out_dir) for config in configs]
    print(
        f"\ndevice={args.device} model={'tiny llama' if args.tiny else 'llama-1b'} "
        f"global batch={args.global_batch}×{args.seq_len} micro={args.micro_batch} "
        f"steps={args.steps} warmup={args.warmup} compile={not args.no_compile} "
        f"torch={results[0].get('torch', '?')}"
    )
    parity_ok = print_losses(results, args.rtol)
    print_throughput(results, args, flops)
    summary = {"args": vars(args), "results": results, "parity_ok": parity_ok}
    (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nJSON results in {out_dir}")
    failed = [r["config"] for r in results if "error" in r]
    return 0 if parity_ok and not failed else 1


def main() -> None:
    sys.path.insert(
        0, str(REPO_ROOT)
    )  # `hpcrl` from a checkout (train_throughput sits beside this file)
    args = parse_args()
    if args.child_config is not None:
        run_child(args)
    sys.exit(run_parent(args))


if __name__ == "__main__":
    main()
