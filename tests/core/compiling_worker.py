"""One compiling Automodel worker in a fresh interpreter, as each job's worker is: the tests of
Inductor's caches and of the ahead-of-time block (test_compile_cache_reuse.py,
test_aot_block.py) run a child script that builds it here and prints its figures.

The real ``AutomodelWorker`` on the tiny recipe, alone in a gloo process group of one, its
decoder blocks compiled with Inductor on CPU (``compile_on_cpu``; jobs compile on GPUs only).
torch is imported in the child only: collecting the tests does not load it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def compiling_worker(model_path: str) -> Any:
    """In the child: the worker, set up (what the script changes in hpcrl must come first)."""
    import socket

    import torch
    import torch.distributed as dist

    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from tests.recipe_builder import tiny_automodel_recipe

    torch.set_num_threads(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    worker = type("CompilingWorker", (AutomodelWorker,), {"compile_on_cpu": True})()
    info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                    master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
    worker.setup(tiny_automodel_recipe(micro_batch_size=2), info, model_path)
    return worker


def report_and_exit(figures: dict[str, Any]) -> None:
    """In the child: the figures as the last line of its output, then exit."""
    print(json.dumps(figures), flush=True)
    os._exit(0)  # gloo's threads may abort a normal interpreter exit (shared/notes)


def run_child(script: str, model_path: str, env: dict[str, str], timeout_s: float) -> dict:
    """In the test: ``script`` in a fresh interpreter (argv: the model's folder), its figures."""
    result = subprocess.run(
        [sys.executable, "-c", script, model_path], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=timeout_s,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    figures: dict = json.loads(result.stdout.strip().splitlines()[-1])
    return figures
