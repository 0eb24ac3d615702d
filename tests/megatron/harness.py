"""Process-level helpers of the Megatron tests: spawned gloo ranks with hpcrl's CPU
compatibility layer (hpcrl/core/backends/megatron/cpu_compat.py).

Worker functions live here (not in test modules) so that spawned children import them by a
stable module path.
"""

from __future__ import annotations

import gc
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from tests.recipe_builder import (
    TINY_MEGATRON_GLOBAL_BATCH,
    TINY_MEGATRON_SEQ_LEN,
    tiny_megatron_recipe,
)


def prepare_cpu_process(skip_patches: frozenset[str] = frozenset()) -> None:
    """For a spawned rank that lives only for one test: the product's CPU layer until exit
    (ranks that go on to set up the real worker nest it again there, as a CPU job does)."""
    from hpcrl.core.backends.megatron.cpu_compat import apply_for_process

    apply_for_process(skip_patches)


def build_converted(base: Path, model_type: str = "llama") -> tuple[str, str]:
    """A tiny HF model of ``model_type`` under ``base`` and its Megatron conversion, made the
    way a job's rank 0 makes it (workers given ``root`` then reuse it)."""
    from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint
    from hpcrl.core.backends.megatron.hf_import import make_converter
    from tests.megatron.tiny_hf import build_tiny_hf_model

    hf_path = str(build_tiny_hf_model(base / "hf", model_type))
    root = str(base / "converted")
    ensure_megatron_checkpoint(
        hf_path, hf_path, root, force=False, rank=0,
        convert=make_converter({}, prepare=prepare_cpu_process),
    )  # fmt: skip
    return hf_path, root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable,
    args: tuple,
    results,
    megatron: bool,
    skip_patches: frozenset[str],
    process_group: bool,
) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    if megatron:
        prepare_cpu_process(skip_patches)
    if process_group:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results[rank] = ("ok", fn(rank, world_size, *args))
    except BaseException:
        results[rank] = ("error", traceback.format_exc())
        raise
    finally:
        if megatron:
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        if dist.is_initialized():  # a TrainingWorker's close destroys its own group
            dist.destroy_process_group()
        gc.collect()
    # gloo threads can abort the interpreter at exit (training-stack-facts.md, trap 2).
    os._exit(0)


def run_ranks(
    world_size: int,
    fn: Callable,
    *args: Any,
    megatron: bool = True,
    skip_patches: frozenset[str] = frozenset(),
    process_group: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks; their results.

    ``megatron``: install the TE placeholders and the CPU compatibility layer (all but ``skip_patches``)
    in each rank first. ``process_group=False``: ``fn`` makes the gloo group itself (the real
    ``TrainingWorker`` does, from its RankInfo; MASTER_ADDR/MASTER_PORT are set for it)."""
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    port = free_port()
    context = mp.start_processes(
        _rank_main,
        args=(world_size, port, fn, args, results, megatron, skip_patches, process_group),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    try:
        while not context.join(timeout=600):
            pass
    finally:
        outcomes = dict(results)
        manager.shutdown()
    errors = [text for status, text in outcomes.values() if status == "error"]
    assert not errors, "\n".join(errors)
    return [outcomes[rank][1] for rank in range(world_size)]


# --------------------------------------------------------------------------- conversion fakes
def counting_converter(
    hf_path: str, out_dir: str, count_file: str, payload: str, sleep_s: float = 0.0
) -> None:
    """A converter that records each call (one line in ``count_file``) and writes ``payload``."""
    import time

    with open(count_file, "a") as counts:
        counts.write(f"{os.getpid()}\n")
    time.sleep(sleep_s)
    with open(os.path.join(out_dir, "weights.txt"), "w") as weights:
        weights.write(payload)


def hanging_converter(hf_path: str, out_dir: str, started_file: str) -> None:
    """Writes half a conversion, signals, then hangs until killed."""
    import time

    with open(os.path.join(out_dir, "weights.txt"), "w") as weights:
        weights.write("half")
    open(started_file, "w").close()
    time.sleep(600)


def record_event(log_file: str, who: str, what: str) -> None:
    """One line ``{who, what, t, pid}`` (t: CLOCK_MONOTONIC, shared by all processes here)."""
    import json
    import time

    with open(log_file, "a") as log:
        log.write(json.dumps({"who": who, "what": what, "t": time.monotonic(), "pid": os.getpid()}))
        log.write("\n")


def lock_holding_converter(
    hf_path: str, out_dir: str, log_file: str, who: str, release_file: str, timeout_s: float
) -> None:
    """Converts only once ``release_file`` exists, i.e. once the other job reported that it is
    blocked on the lock; gives up after ``timeout_s`` (the other job never blocked)."""
    import time

    record_event(log_file, who, "convert_start")
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(release_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{who}: the other job never reported waiting for the lock")
        time.sleep(0.05)
    with open(os.path.join(out_dir, "weights.txt"), "w") as weights:
        weights.write(who)
    record_event(log_file, who, "convert_end")


def racing_job(root: str, log_file: str, who: str, release_file: str, timeout_s: float) -> str:
    """Child-process entry: one job's ``ensure_megatron_checkpoint``, every step logged."""
    import functools
    import pathlib

    from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint

    def progress(message: str) -> None:
        record_event(log_file, who, message)
        if message.startswith("waiting for"):
            pathlib.Path(release_file).touch()

    convert = functools.partial(
        lock_holding_converter,
        log_file=log_file,
        who=who,
        release_file=release_file,
        timeout_s=timeout_s,
    )
    record_event(log_file, who, "enter")
    final = ensure_megatron_checkpoint(
        "org/tiny", "/hf/tiny", root, force=False, convert=convert, rank=0,
        progress=progress, poll_s=0.05,
    )  # fmt: skip
    record_event(log_file, who, "exit")
    return str(final)


def ensure_hanging(root: str, started_file: str) -> None:
    import functools

    from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint

    convert = functools.partial(hanging_converter, started_file=started_file)
    ensure_megatron_checkpoint("org/tiny", "/hf/tiny", root, force=False, convert=convert, rank=0)


def ensure_on_rank(rank: int, world_size: int, root: str, count_file: str) -> str:
    import functools

    from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint

    convert = functools.partial(
        counting_converter, count_file=count_file, payload="v1", sleep_s=1.0
    )
    return str(
        ensure_megatron_checkpoint(
            "org/tiny", "/hf/tiny", root, force=False, convert=convert, rank=rank, poll_s=0.1
        )
    )


# --------------------------------------------------------------------------- backend runs
SEQ_LEN = TINY_MEGATRON_SEQ_LEN
GLOBAL_BATCH = TINY_MEGATRON_GLOBAL_BATCH


def masked_nll(logprobs, micro_batch, num_global_tokens):
    """SFT-style loss: -sum(token logprobs over the mask) / global token count."""
    mask = micro_batch["token_mask"]
    loss = -(logprobs * mask).sum() / num_global_tokens
    return loss, {"tokens": float(mask.sum())}


def fixed_batch(seed: int = 0) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 100, (GLOBAL_BATCH, SEQ_LEN), generator=generator)
    token_mask = torch.ones(GLOBAL_BATCH, SEQ_LEN)
    token_mask[:, :4] = 0  # a "prompt" that does not count
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "token_mask": token_mask,
    }


UNPLANNED_SUFFIX = ".from-the-environment"


def setup_worker(rank: int, world_size: int, recipe, hf_path: str, ckpt_root: str):
    from hpcrl.core.backends.base import RankInfo

    # A job's environment may name another conversion dir; the plan's (RankInfo) must win.
    os.environ["NRL_MEGATRON_CHECKPOINT_DIR"] = ckpt_root + UNPLANNED_SUFFIX
    from hpcrl.core.backends.megatron.worker import MegatronWorker

    worker = MegatronWorker()  # device "cpu" below: it enters the CPU layer itself
    place = worker.setup(
        recipe,
        RankInfo(
            rank=rank,
            world_size=world_size,
            local_rank=rank,
            local_world_size=world_size,
            node_rank=0,
            master_addr="127.0.0.1",
            master_port=0,
            device="cpu",
            megatron_checkpoint_dir=ckpt_root,  # as the driver passes JobSpec's
        ),
        hf_path,
    )
    return worker, place


def shard(batch: dict, place) -> dict:
    rows = batch["input_ids"].shape[0] // place.dp_size
    return {k: v[place.dp_rank * rows : (place.dp_rank + 1) * rows] for k, v in batch.items()}


def micro_batches(batch: dict, size: int) -> list[dict]:
    rows = batch["input_ids"].shape[0]
    return [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, rows, size)]


def train_run(
    rank: int, world_size: int, recipe_kwargs: dict, hf_path: str, ckpt_root: str, steps: int
) -> dict:
    """Set up the real MegatronWorker, train ``steps`` steps on a fixed batch."""
    recipe = tiny_megatron_recipe(hf_path, **recipe_kwargs)
    worker, place = setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    batch = fixed_batch()
    num_tokens = float(batch["token_mask"].sum())
    my_shard = shard(batch, place)
    initial_logprobs = worker.logprobs(my_shard)
    history = []
    passes = []  # the worker's pass figures per step (pass_stats)
    for _ in range(steps):
        metrics = worker.train_step(
            micro_batches(my_shard, recipe.policy.train_micro_batch_size), masked_nll, num_tokens
        )
        history.append(metrics)
        passes.append(worker.take_pass_metrics())
    reference = worker.reference_logprobs(my_shard)
    worker.close()
    return {
        "place": (place.dp_rank, place.dp_size, place.returns_results),
        "history": history,
        "passes": passes,
        "initial_logprobs": initial_logprobs if place.returns_results else None,
        "reference_logprobs": reference if place.returns_results else None,
    }


def start_training_worker(
    rank: int, world_size: int, recipe, hf_path: str, ckpt_root: str, port: int
):
    """The real ``TrainingWorker`` hosting the Megatron backend, set up as a job's rank is
    (run with ``process_group=False``: the worker makes the gloo group, on ``port``);
    (worker, place)."""
    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.backends.base import RankInfo
    from hpcrl.core.workers.actor import TrainingWorker
    from hpcrl.core.workers.group import worker_env

    worker = TrainingWorker(worker_class_path("megatron"), worker_env("cpu"))
    rank_info = RankInfo(rank=rank, world_size=world_size, local_rank=rank,
                         local_world_size=world_size, node_rank=0, master_addr="127.0.0.1",
                         master_port=port, device="cpu", megatron_checkpoint_dir=ckpt_root)  # fmt: skip
    return worker, worker.setup(recipe, rank_info, hf_path, 1)


def worker_train(worker, place) -> dict[str, float]:
    """One ``TrainingWorker.train`` step on this rank's shard of ``fixed_batch()``, planned
    as the controller plans fixed micro-batches of 2 rows."""
    from hpcrl.core.workers.micro_batches import MicroBatchSpec

    batch = shard(fixed_batch(), place)
    rows = len(batch["input_ids"])
    plan = [MicroBatchSpec(rows=(row, row + 1), width=SEQ_LEN) for row in range(0, rows, 2)]
    num_tokens = float(fixed_batch()["token_mask"].sum())
    return worker.train(batch, masked_nll, num_tokens, plan)


def manual_gc_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, interval: int, steps: int
) -> dict:
    """Train with manual GC through the real ``TrainingWorker`` hosting the Megatron backend,
    as a job's rank does; record automatic-GC state and the full collections per optimizer
    step."""
    recipe = tiny_megatron_recipe(hf_path, manual_gc_interval=interval)
    gc_was_enabled_before = gc.isenabled()
    port = int(os.environ["MASTER_PORT"])  # run_ranks's, for the group the worker makes
    worker, place = start_training_worker(rank, world_size, recipe, hf_path, ckpt_root, port)
    enabled_after_setup = gc.isenabled()
    with FullCollections() as collections:
        for collections.step in range(1, steps + 1):
            worker_train(worker, place)
            # Garbage that an automatic collection would otherwise pick up.
            junk = [{"i": i} for i in range(20000)]
            for item in junk:
                item["self"] = item
            del junk
    child_gc = _gc_enabled_in_forked_child()
    worker.close()
    return {
        "before": gc_was_enabled_before,
        "after_setup": enabled_after_setup,
        "collections_at_steps": collections.steps,
        "forked_child_gc": child_gc,
        "after_close": gc.isenabled(),
    }


class FullCollections:
    """While entered: the optimizer step (``step``, set by the caller) of every full
    (generation 2) collection in this process, in ``steps``."""

    def __init__(self) -> None:
        self.step = 0
        self.steps: list[int] = []

    def _record(self, phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            self.steps.append(self.step)

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._record)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._record)


def _gc_enabled_in_forked_child() -> bool:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        import gc

        os.write(write_fd, b"1" if gc.isenabled() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    return os.read(read_fd, 1) == b"1"


def roundtrip_run(rank: int, world_size: int, hf_path: str, ckpt_root: str, tp: int, out_dir: str):
    """Load the conversion at TP=``tp``, return log-probs (reporting rank) and export to HF."""
    recipe = tiny_megatron_recipe(hf_path, tp=tp)
    worker, place = setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    logprobs = worker.logprobs(shard(fixed_batch(), place))
    worker.export_hf(out_dir)
    worker.close()
    return logprobs if place.returns_results else None


def train_steps(worker, place, count: int) -> list[dict]:
    """``count`` steps on this rank's shard of ``fixed_batch()`` (micro-batches of 2)."""
    batch_all = fixed_batch()
    num_tokens = float(batch_all["token_mask"].sum())
    batch = shard(batch_all, place)
    return [
        worker.train_step(micro_batches(batch, 2), masked_nll, num_tokens) for _ in range(count)
    ]


def offload_fractions_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, fractions: list, steps: int
) -> dict:
    """Train ``steps`` steps with optimizer CPU offload at each fraction in turn (0: off),
    through the real worker, bf16 params with fp32 main copies (offload's setting: with fp32
    params megatron's main params are views, which HybridDeviceOptimizer cannot take), the
    HybridDeviceOptimizer under tests/megatron/offload_standin.py; one process for all
    fractions (one import of megatron-core). ``{fraction: {history, offload facts}}``."""
    from tests.megatron import offload_standin

    offload_standin.apply_for_process_lifetime()
    results = {}
    for fraction in fractions:
        recipe = tiny_megatron_recipe(hf_path, offload_fraction=fraction, precision="bfloat16")
        worker, place = setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
        history = train_steps(worker, place, steps)
        facts = offload_standin.offload_facts(worker.optimizer)
        worker.close()
        results[fraction] = {"history": history, **facts}
    return results


def generate_run(
    rank: int, world_size: int, hf_path: str, ckpt_root: str, tp: int, prompts: list
) -> dict:
    """Greedy generation at TP=``tp`` as a training worker does it: the torch engine refitted
    from the Megatron worker's ``export_hf_weights`` (TP shards gathered by megatron-bridge)."""
    import torch
    from transformers import AutoConfig

    from hpcrl.config.recipe import GenerationCfg
    from hpcrl.core.generation.torch_engine import TorchEngine

    worker, place = setup_worker(
        rank, world_size, tiny_megatron_recipe(hf_path, tp=tp), hf_path, ckpt_root
    )
    engine = TorchEngine(AutoConfig.from_pretrained(hf_path), device="cpu", dtype=torch.float32)
    cfg = GenerationCfg(max_new_tokens=8, temperature=0.0)
    engine.update_weights(worker.export_hf_weights())
    out = engine.generate(prompts, cfg, seed=3)
    # Train one step: the next generation must see the new weights.
    batch = fixed_batch()
    worker.train_step(
        micro_batches(shard(batch, place), 2), masked_nll, float(batch["token_mask"].sum())
    )
    engine.update_weights(worker.export_hf_weights())
    after = engine.generate(prompts, cfg, seed=3)
    worker.close()
    return {"before": out, "after": after}
