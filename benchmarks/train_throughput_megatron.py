"""The Megatron rows of ``train_throughput.py``: each loop in its own process.

megatron-core only on GPUs (no megatron-bridge needed; on the CPU the worker's CPU layer
imports it, as a CPU job's does). The same shape, batch and optimizer as the HF rows (bf16
with fp32 main weights, distributed optimizer, Adam(W) with weight decay 0.01, clip 1.0);
every loop starts from the same weights, so the first losses agree.

- ``megatron``: hpcrl's Megatron backend — the worker set up by ``MegatronWorker.setup``
  itself from an SFT recipe of this shape (parallel state, ``build_optimizer``,
  ``connect_grad_sync``, ``build_scheduler``, the reference weights' copy, as a job's rank;
  its peak memory counts that copy), its model alone replaced (``_load_model``): a stand-in
  for the bridge's provider that builds the same random GPTModel, through the worker's own
  ``prepare_provider`` (without Transformer Engine the local spec with hpcrl's SDPA core
  attention, with TE the TE spec) and ``build_model`` (megatron DDP); every step through
  ``MegatronWorker.train_step`` itself (zero_grad, ``step.run_train_microbatches`` with its
  vocab-parallel log-probs and metric all-reduce, optimizer step, scheduler), then the
  manual-GC hook the hosting ``TrainingWorker`` runs after it (the backend has none).
  Not included: the worker's HF→Megatron conversion and weight loading (setup only).
  tests/megatron/test_train_throughput_rows.py runs this row and the raw SDPA one on the CPU.
  ``megatron[unfused]`` (``--megatron-attention sdpa,unfused``) is the same path with the
  local spec's own attention.
- ``megatron-raw[<attention>]``: what a megatron-core user writes, nothing of hpcrl's step:
  plain megatron-core objects (``megatron_offload.build``: GPTModel, DDP, distributed
  optimizer, the four ``config`` hooks megatron's own training loop sets) trained by
  megatron-core's ``get_forward_backward_func`` with the model's own loss (``labels=``:
  megatron's vocab-parallel cross-entropy) and a masked mean, as megatron's pretrain_gpt
  does; on the local spec with megatron's unfused ``DotProductAttention`` (``unfused``), with
  the same SDPA core attention hpcrl uses (``sdpa``: the strongest raw loop without TE), and
  on the TE spec (``te``) wherever Transformer Engine is installed. The backend is reported
  against the best raw row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch


def transformer_engine_installed() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA library behind it
        return False
    return True


def megatron_args(args: argparse.Namespace, spec, attention: str) -> argparse.Namespace:
    """``benchmarks/megatron_offload.py``'s settings for this shape and batch (fraction 0)."""
    return argparse.Namespace(
        layers=spec.num_hidden_layers, hidden=spec.hidden_size, heads=spec.num_attention_heads,
        ffn=spec.intermediate_size, vocab=spec.vocab_size or 256, seq_len=args.seq_len,
        batch_size=args.batch_size, micro_batch_size=None, tp=1, dp=1, seed=1234, lr=1e-5,
        fraction=0.0, overlap_d2h_h2d=False, device=args.device, attention=attention,
    )  # fmt: skip


def te_layer_spec():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    return get_gpt_layer_with_transformer_engine_spec()


class RandomGptProvider:
    """Stands in for megatron-bridge's GPT provider (the GPU machine has no bridge wheel).

    Starts with the spec the bridge's provider would choose (TE's when TE is installed);
    ``prepare_provider`` sets its fields on it as on the real one (layer spec, parallel sizes,
    dtypes); ``provide_distributed_model`` builds the raw loop's random GPTModel on the layer
    spec that ``prepare_provider`` chose. (Shape and dtypes come from ``megatron_args``.)
    """

    def __init__(self, shape: argparse.Namespace) -> None:
        self.shape = shape
        self.transformer_layer_spec = te_layer_spec() if transformer_engine_installed() else None

    def provide_distributed_model(self, **_kwargs) -> list:
        from benchmarks import megatron_offload

        config = megatron_offload.transformer_config(self.shape)
        return [megatron_offload.gpt_model(self.shape, config, self.transformer_layer_spec)]


def hpcrl_megatron_worker(shape: argparse.Namespace, attention: str, total_steps: int):
    """A ``MegatronWorker`` set up by its own ``setup``, as a job's rank is (CPU layer,
    parallel state, optimizer, scheduler, the reference weights' copy, the step's helpers),
    but for the model: ``_load_model`` (HF conversion and weight loading: the benchmark
    has no HF checkpoint, and its rows share random weights) is replaced by the random
    GPTModel on the provider stand-in, through the worker's own ``prepare_provider`` and
    ``build_model``."""
    from hpcrl.core.backends.megatron import model as mcore_model
    from hpcrl.core.backends.megatron.provider import prepare_provider
    from hpcrl.core.backends.megatron.worker import MegatronWorker

    # Defined here: the parent process (the HF rows) imports this module, megatron never.
    class RandomWeights(MegatronWorker):
        def _load_model(self) -> list:
            provider = RandomGptProvider(shape)
            policy = self.recipe.policy
            prepare_provider(provider, self.cfg, policy.precision, policy.max_total_sequence_length)
            # the CPU generator the initialisation draws from, seeded as the raw loop's
            torch.manual_seed(shape.seed)
            return mcore_model.build_model(provider, self.cfg, on_cpu=shape.device == "cpu")

    worker = RandomWeights()
    worker.setup(benchmark_recipe(shape, attention, total_steps), rank_info(shape.device), "")
    return worker


def benchmark_recipe(shape: argparse.Namespace, attention: str, total_steps: int):
    """SFT on the Megatron backend at this shape and batch (bf16 with fp32 main weights,
    distributed optimizer, Adam with weight decay 0.01, clip 1.0; manual GC off, the default);
    its seed is the raw loop's, so both start from the same weights."""
    from hpcrl.config.recipe import (
        DataCfg,
        DistributedDataParallelCfg,
        MegatronCfg,
        MegatronOptimizerCfg,
        PolicyCfg,
        Recipe,
        SftCfg,
    )

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
    policy = PolicyCfg(
        model_name="random-gpt", train_global_batch_size=shape.batch_size,
        train_micro_batch_size=shape.batch_size, precision="bfloat16",
        max_total_sequence_length=shape.seq_len, megatron_cfg=cfg,
    )  # fmt: skip
    return Recipe(
        policy=policy,
        data=DataCfg(train_path="unused.jsonl"),
        sft=SftCfg(max_num_steps=total_steps, seed=shape.seed),
    )


def rank_info(device: str):
    """This process's place, from the environment ``megatron_offload.init_distributed`` set."""
    import os

    from hpcrl.core.backends.base import RankInfo

    world_size = int(os.environ["WORLD_SIZE"])
    return RankInfo(
        rank=int(os.environ["RANK"]), world_size=world_size,
        local_rank=int(os.environ["LOCAL_RANK"]),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), node_rank=0,
        master_addr=os.environ["MASTER_ADDR"], master_port=int(os.environ["MASTER_PORT"]),
        device=device,
    )  # fmt: skip


def raw_megatron_step(chunks: list, optimizer, batch: dict, device: str):
    """One step as a megatron-core user writes it (megatron's pretrain_gpt and train_step):
    ``labels=`` into GPTModel (its vocab-parallel cross-entropy, per token), a masked mean over
    the batch's predicted tokens — the same quantity as ``nll_loss`` — through
    ``get_forward_backward_func``, then the optimizer step."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    input_ids = batch["input_ids"].to(device)
    batch_size, seq_len = input_ids.shape
    positions = torch.arange(seq_len, device=device).unsqueeze(0).expand_as(input_ids)
    # Position t predicts token t + 1; the last position predicts nothing (mask 0).
    labels = torch.zeros_like(input_ids)
    labels[:, :-1] = input_ids[:, 1:]
    loss_mask = torch.zeros(batch_size, seq_len, device=device)
    loss_mask[:, :-1] = batch["token_mask"][:, 1:].to(device)
    num_tokens = loss_mask.sum()
    forward_backward = get_forward_backward_func()

    def loss_func(output_tensor):
        loss = (output_tensor.float() * loss_mask).sum() / num_tokens
        return loss, {"lm loss": loss.detach()}

    def forward_step(data_iterator, model):
        next(data_iterator)
        return model(input_ids, positions, None, labels=labels), loss_func

    def step() -> float:
        for chunk in chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(
            forward_step_func=forward_step, data_iterator=iter([None]), model=chunks,
            num_microbatches=1, seq_length=seq_len, micro_batch_size=batch_size,
            forward_only=False,
        )  # fmt: skip
        optimizer.step()
        return float(losses[0]["lm loss"])

    return step


def build_raw_megatron(shape: argparse.Namespace) -> tuple[list, object]:
    from benchmarks import megatron_offload

    if shape.attention != "te":
        return megatron_offload.build(shape)
    # megatron_offload.build on the TE spec: same objects, TE's layers and fused attention.
    original = megatron_offload.gpt_model
    megatron_offload.gpt_model = lambda args, config, _spec: original(args, config, te_layer_spec())
    try:
        return megatron_offload.build(shape)
    finally:
        megatron_offload.gpt_model = original


def megatron_rows(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(row name, loop, attention) of the Megatron loops this run asks for."""
    rows = []
    for attention in args.megatron_attention:
        rows.append(("megatron" if attention == "sdpa" else f"megatron[{attention}]", "megatron",
                     attention))  # fmt: skip
    raw = ["unfused", "sdpa"] + (["te"] if transformer_engine_installed() else [])
    return rows + [(f"megatron-raw[{attention}]", "megatron-raw", attention) for attention in raw]


def run_megatron(args: argparse.Namespace, spec, loop: str, attention: str, time_windows) -> dict:
    """One Megatron loop in this process: per-window step times, first loss, peak GiB."""
    from benchmarks import megatron_offload
    from benchmarks.train_throughput import make_batch, nll_loss

    shape = megatron_args(args, spec, attention)
    megatron_offload.init_distributed(args.device)
    batch = make_batch(shape.vocab, args.batch_size, args.seq_len)
    if loop == "megatron-raw":
        chunks, optimizer = build_raw_megatron(shape)
        step = raw_megatron_step(chunks, optimizer, batch, args.device)
    else:
        total_steps = args.warmup + args.rounds * args.megatron_steps
        from hpcrl.core.workers.manual_gc import ManualGc

        worker = hpcrl_megatron_worker(shape, attention, total_steps)
        chunks, num_tokens = worker.model_chunks, float(batch["token_mask"].sum())
        # What a job's TrainingWorker does around the backend (the GC owner of its process):
        # manual GC off, as in the recipe default; setup's heap and step 1's frozen.
        manual_gc = ManualGc.from_recipe(worker.recipe)
        manual_gc.after_setup()

        def step() -> float:
            loss = worker.train_step([batch], nll_loss, num_tokens)["loss"]
            manual_gc.after_optimizer_step(worker.steps_done)
            return loss

    kinds = {type(m).__name__ for n, m in chunks[0].named_modules() if n.endswith("core_attention")}
    print(f"{loop}[{attention}]: core attention {sorted(kinds)}", flush=True)
    return time_windows(step, args.megatron_steps)


def run_megatron_subprocess(args: argparse.Namespace, loop: str, attention: str, out: Path):
    """One Megatron loop in a fresh process (clean GPU memory, its own process group)."""
    command = [
        sys.executable, str(Path(__file__).with_name("train_throughput.py")), "--only", loop,
        "--megatron-attention", attention, "--device", args.device,
        "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
        "--warmup", str(args.warmup), "--rounds", str(args.rounds),
        "--megatron-steps", str(args.megatron_steps), "--json-out", str(out),
    ]  # fmt: skip
    subprocess.run(command + (["--tiny"] if args.tiny else []), check=True)
    return json.loads(out.read_text())
