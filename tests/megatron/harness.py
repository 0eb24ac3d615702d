"""Process-level helpers of the Megatron tests: spawned gloo ranks with the CPU patch layer.

Worker functions live here (not in test modules) so that spawned children import them by a
stable module path.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def prepare_cpu_process() -> None:
    """For a spawned child that lives only for one job: TE stand-in + patches until exit."""
    from tests.megatron import cpu_patches, te_standin

    te_standin.import_bridge_without_te()
    # Entered for the rest of the child's life; the child exits right after its work.
    contextlib.ExitStack().enter_context(cpu_patches.cpu_patches())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, fn: Callable, args: tuple, results,
               megatron: bool) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    if megatron:
        prepare_cpu_process()
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
        dist.destroy_process_group()
        gc.collect()
    # gloo threads can abort the interpreter at exit (training-stack-facts.md, trap 2).
    os._exit(0)


def run_ranks(world_size: int, fn: Callable, *args: Any, megatron: bool = True) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks; their results.

    ``megatron``: install the TE stand-in and the CPU patch layer in each rank first."""
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    port = free_port()
    context = mp.start_processes(_rank_main, args=(world_size, port, fn, args, results, megatron),
                                 nprocs=world_size, join=False, start_method="spawn")
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
def counting_converter(hf_path: str, out_dir: str, count_file: str, payload: str, sleep_s: float = 0.0) -> None:
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


def ensure_in_process(root: str, converter_args: tuple, force: bool = False) -> str:
    """Child-process entry: ensure a conversion with ``counting_converter``."""
    import functools

    from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint

    convert = functools.partial(counting_converter, count_file=converter_args[0], payload=converter_args[1],
                                sleep_s=converter_args[2])
    return str(ensure_megatron_checkpoint("org/tiny", "/hf/tiny", root, force=force, convert=convert,
                                          rank=0, poll_s=0.1))


def ensure_hanging(root: str, started_file: str) -> None:
    import functools

    from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint

    convert = functools.partial(hanging_converter, started_file=started_file)
    ensure_megatron_checkpoint("org/tiny", "/hf/tiny", root, force=False, convert=convert, rank=0)


def ensure_on_rank(rank: int, world_size: int, root: str, count_file: str) -> str:
    import functools

    from hpcrl.core.backends.megatron.conversion import ensure_megatron_checkpoint

    convert = functools.partial(counting_converter, count_file=count_file, payload="v1", sleep_s=1.0)
    return str(ensure_megatron_checkpoint("org/tiny", "/hf/tiny", root, force=False, convert=convert,
                                          rank=rank, poll_s=0.1))
