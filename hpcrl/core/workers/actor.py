"""The Ray actor that hosts one rank: process group, one backend worker, manual GC.

Wrapped with ``ray.remote`` by ``hpcrl.core.workers.group`` (this module imports no Ray, so
it can also be driven directly in a plain process). The actor owns the torch.distributed
group; the backend owns model, optimizer and meshes.
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hpcrl.core.metrics import HostMemoryTracker
from hpcrl.core.workers.manual_gc import ManualGc
from hpcrl.core.workers.micro_batches import materialize

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe
    from hpcrl.core.backends.base import BackendWorker, DataParallelPlace, RankInfo
    from hpcrl.core.policy import Batch, LossFn
    from hpcrl.core.workers.micro_batches import MicroBatchSpec


class TrainingWorker:
    """One rank. Methods mirror ``BackendWorker``; the controller calls all ranks together."""

    def __init__(self, worker_class_path: str, env: dict[str, str] | None = None) -> None:
        os.environ.update(env or {})
        self._worker_class_path = worker_class_path
        self._backend: BackendWorker | None = None
        self._manual_gc: ManualGc | None = None
        self._recipe: Recipe | None = None
        self._optimizer_steps = 0
        self._host_memory = HostMemoryTracker()

    # ------------------------------------------------------------------ placement
    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pick_free_port(self) -> int:
        """A port free on this node now (rank 0 calls it for MASTER_PORT)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def pid(self) -> int:
        return os.getpid()

    # ------------------------------------------------------------------ lifecycle
    def setup(
        self, recipe: Recipe, rank_info: RankInfo, model_path: str, num_threads: int
    ) -> DataParallelPlace:
        import torch
        import torch.distributed as dist

        from hpcrl.core.backends import load_worker_class

        os.environ.update(
            RANK=str(rank_info.rank),
            WORLD_SIZE=str(rank_info.world_size),
            LOCAL_RANK=str(rank_info.local_rank),
            LOCAL_WORLD_SIZE=str(rank_info.local_world_size),
            MASTER_ADDR=rank_info.master_addr,
            MASTER_PORT=str(rank_info.master_port),
        )
        if rank_info.device == "cpu":
            torch.set_num_threads(num_threads)
        else:
            # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU.
            torch.cuda.set_device(0)
        dist.init_process_group(backend="nccl" if rank_info.device == "cuda" else "gloo")
        self._recipe = recipe
        self._backend = load_worker_class(self._worker_class_path)()
        place = self._backend.setup(recipe, rank_info, model_path)
        self._manual_gc = ManualGc.from_recipe(recipe)
        self._manual_gc.after_setup()
        return place

    def close(self) -> None:
        """Free everything, then the process group (order avoids gloo's exit abort)."""
        import torch.distributed as dist

        if self._backend is not None:
            self._backend.close()
        self._backend = None
        if self._manual_gc is not None:
            self._manual_gc.restore()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()

    # ------------------------------------------------------------------ work
    def train(
        self,
        shard: Batch,
        loss_fn: LossFn,
        num_global_tokens: float,
        plan: Sequence[MicroBatchSpec],
    ) -> dict[str, float]:
        """One optimizer step over ``shard``, cut into micro-batches as the controller
        planned them (``hpcrl.core.workers.micro_batches``: fixed, dynamic or packed)."""
        assert self._backend is not None and self._manual_gc is not None, "setup first"
        micro_batches = [materialize(shard, spec) for spec in plan]
        metrics = self._backend.train_step(micro_batches, loss_fn, num_global_tokens)
        self._optimizer_steps += 1
        self._manual_gc.after_optimizer_step(self._optimizer_steps)
        return metrics

    def logprobs(self, shard: Batch, plan: Sequence[MicroBatchSpec]) -> torch.Tensor:
        assert self._backend is not None, "setup first"
        return self._backend.logprobs(shard, plan)

    def reference_logprobs(self, shard: Batch, plan: Sequence[MicroBatchSpec]) -> torch.Tensor:
        assert self._backend is not None, "setup first"
        return self._backend.reference_logprobs(shard, plan)

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], cfg: GenerationCfg, seed: int
    ) -> dict[str, torch.Tensor]:
        assert self._backend is not None, "setup first"
        return self._backend.generate(prompt_ids, cfg, seed)

    def offload_optimizer(self) -> None:
        assert self._backend is not None, "setup first"
        self._backend.offload_optimizer()

    def onload_optimizer(self) -> None:
        assert self._backend is not None, "setup first"
        self._backend.onload_optimizer()

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        assert self._backend is not None, "setup first"
        self._backend.save_checkpoint(checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        assert self._backend is not None, "setup first"
        self._backend.load_checkpoint(checkpoint_dir)
        self._optimizer_steps = int(self._backend.collect_state()["step"])

    def export_hf(self, out_dir: str) -> None:
        assert self._backend is not None, "setup first"
        self._backend.export_hf(out_dir)

    def collect_state(self) -> dict[str, Any]:
        """The backend's state, plus this rank's optimizer steps and its peak host memory (the
        driver sums the ranks' peaks: Ray workers are not the driver's child processes)."""
        assert self._backend is not None, "setup first"
        return {
            **self._backend.collect_state(),
            "worker_optimizer_steps": self._optimizer_steps,
            "peak_host_rss_gb": self._host_memory.sample(),
        }

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(backend, *args)`` on this rank (diagnostics and tests)."""
        return fn(self._backend, *args)
