"""The Ray actor that hosts one rank: process group, one backend worker, manual GC, and the
rank's colocated generation engine.

Wrapped with ``ray.remote`` by ``hpcrl.core.workers.group`` (this module imports no Ray, so
it can also be driven directly in a plain process). The actor owns the torch.distributed
group; the backend owns model, optimizer and meshes.

The engine slot (``hpcrl.core.generation.engine``): built on the first ``generate`` from the
recipe's spec (the torch engine, or colocated vLLM), and refitted from the backend's
``export_hf_weights()`` whenever the weights changed since its last refit (every optimizer
step and checkpoint load bumps the worker's weights version). Every rank refits together
(gathering sharded weights is a collective), then samples its own shard independently.
A colocated vLLM engine of tp × pp > 1 spans a group of that many ranks
(``hpcrl.core.workers.engine_group``): only the group's first rank holds it, loads the
refit and samples the group's shard; the others join the refit's gather and return None.
A group larger than a node spans whole nodes: the group's first rank on each other node
starts that node's engine workers (``EngineNodeWorkers``, ``hpcrl.core.generation.vllm_nodes``)
beside the engine's start, and the engine's refit files go to a folder every node sees.
"""

from __future__ import annotations

import gc
import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcrl.core.collection_clock import CollectionClock
from hpcrl.core.compile_stats import compile_cache_counts
from hpcrl.core.metrics import HostMemoryTracker
from hpcrl.core.workers.allocator_counters import AllocatorCounters
from hpcrl.core.workers.engine_group import EngineGroup, spans_nodes
from hpcrl.core.workers.first_launch import pay_triton_key
from hpcrl.core.workers.manual_gc import ManualGc
from hpcrl.core.workers.micro_batches import materialize
from hpcrl.core.workers.out_of_memory import cuda_memory_gb, names_gpu_out_of_memory

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe
    from hpcrl.core.backends.base import BackendWorker, DataParallelPlace, RankInfo
    from hpcrl.core.generation.engine import (
        EngineSpec,
        GenerationEngine,
        ShardGeneration,
    )
    from hpcrl.core.generation.engine_devices import EngineDevices, EngineNodeRank
    from hpcrl.core.generation.vllm_nodes import EngineNodeWorkers
    from hpcrl.core.policy import Batch, LossFn
    from hpcrl.core.workers.micro_batches import MicroBatchSpec


class TrainingWorker:
    """One rank. Methods mirror ``BackendWorker``; the controller calls all ranks together."""

    def __init__(self, worker_class_path: str, env: dict[str, str] | None = None) -> None:
        os.environ.update(env or {})
        self._worker_class_path = worker_class_path
        self._backend: BackendWorker | None = None
        self._manual_gc: ManualGc | None = None
        self._collections = CollectionClock()
        self._allocations = AllocatorCounters()
        self._recipe: Recipe | None = None
        self._place: DataParallelPlace | None = None
        self._optimizer_steps = 0
        self._engine_spec: EngineSpec | None = None
        self._engine: GenerationEngine | None = None
        self._engine_group: EngineGroup | None = None
        self._engine_devices: EngineDevices | None = None  # a multi-rank engine's leader only
        # An engine across nodes: this rank's node of it (first rank of the group per node).
        self._engine_node: EngineNodeRank | None = None
        self._node_workers: EngineNodeWorkers | None = None  # node rank > 0 of such an engine
        self._weights_version = 0  # bumped whenever the backend's weights change
        self._refitted = 0  # the weights version this rank's engine group last loaded
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
    @names_gpu_out_of_memory("setup")
    def setup(
        self, recipe: Recipe, rank_info: RankInfo, model_path: str, num_threads: int
    ) -> DataParallelPlace:
        import torch
        import torch.distributed as dist

        from hpcrl.core.backends import load_worker_class
        from hpcrl.core.generation.engine import colocated_engine_spec

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
            dist.init_process_group(backend="gloo")
        else:
            # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU. Bound to it, NCCL makes
            # its communicator now (eager init), not in the first step's first collective
            # (0.31 s of a warm first step on one H100).
            torch.cuda.set_device(0)
            dist.init_process_group(backend="nccl", device_id=torch.device("cuda", 0))
        self._recipe = recipe
        self._backend = load_worker_class(self._worker_class_path)()
        place = self._backend.setup(recipe, rank_info, model_path)
        self._place = place
        self._engine_spec = colocated_engine_spec(recipe, model_path, rank_info.device)
        self._engine_group = EngineGroup(
            rank=rank_info.rank, ranks_per_engine=rank_info.engine_ranks
        )
        if self._engine_spec is not None and spans_nodes(
            self._engine_group, rank_info.local_world_size
        ):
            self._place_engine_across_nodes(rank_info)
        elif self._engine_spec is not None and rank_info.engine_ranks > 1:
            self._engine_devices = self._group_devices(rank_info)
        self._build_torch_engine_now()
        pay_triton_key()  # once per process: here, not at the first step's first kernel
        self._manual_gc = ManualGc.from_recipe(recipe)
        self._manual_gc.after_setup()
        self._collections.install()
        self._allocations.take()  # the steps' counts start here, after setup's
        return place

    def _build_torch_engine_now(self) -> None:
        """The torch engine is built in setup, not at the first generate: it loads its
        compiled pieces (an earlier run's, from the compile cache) here. Its weights come at
        the first refit, its KV cache with the first batch: no memory held before the first
        step needs it. A model it cannot run is named where it always was, at the first
        generate (a run that only trains never meets it)."""
        from hpcrl.core.generation.decoder import UnsupportedModelError

        spec, group = self._engine_spec, self._engine_group
        if spec is None or spec.backend != "torch" or group is None or not group.leads:
            return
        try:
            self._engine = spec.build(self._engine_devices)
        except UnsupportedModelError:
            self._engine = None

    def _group_devices(self, rank_info: RankInfo) -> EngineDevices | None:
        """The devices of this rank's engine group, for its leader (None elsewhere)."""
        from hpcrl.core.workers.engine_group import cpu_engine_devices, cuda_engine_devices

        group = self._engine_group
        assert group is not None
        if rank_info.device == "cuda":
            devices = cuda_engine_devices(group)  # a collective: every rank
        else:
            devices = cpu_engine_devices(group, rank_info.local_rank, rank_info.local_world_size)
        return devices if group.leads else None

    def _place_engine_across_nodes(self, rank_info: RankInfo) -> None:
        """This rank's part of an engine larger than a node (collectives: every rank calls
        it): the first rank of the group on each node runs that node's engine processes on
        the devices of the group's ranks there, node rank 0 the engine itself."""
        import ray

        from hpcrl.core.workers.engine_group import engine_node_rank, node_engine_devices

        group, local = self._engine_group, rank_info.local_rank
        assert group is not None and rank_info.engine_refit_dir is not None
        devices = node_engine_devices(group, local, rank_info.local_world_size, rank_info.device)
        node = engine_node_rank(
            group,
            rank_info.local_world_size,
            ray.util.get_node_ip_address(),
            rank_info.engine_refit_dir,
        )
        if local == 0:
            self._engine_devices, self._engine_node = devices, node

    def close(self) -> None:
        """Free everything, then the process group (order avoids gloo's exit abort)."""
        import torch.distributed as dist

        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._node_workers is not None:
            self._node_workers.shutdown()
            self._node_workers = None
        if self._backend is not None:
            self._backend.close()
        self._backend = None
        if self._manual_gc is not None:
            self._manual_gc.restore()
        self._collections.remove()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()

    # ------------------------------------------------------------------ work
    @names_gpu_out_of_memory("train")
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
        self._weights_version += 1
        self._optimizer_steps += 1
        self._manual_gc.after_optimizer_step(self._optimizer_steps)
        return metrics

    @names_gpu_out_of_memory("logprobs")
    def logprobs(self, shard: Batch, plan: Sequence[MicroBatchSpec]) -> torch.Tensor:
        assert self._backend is not None, "setup first"
        return self._backend.logprobs(shard, plan)

    @names_gpu_out_of_memory("reference_logprobs")
    def reference_logprobs(self, shard: Batch, plan: Sequence[MicroBatchSpec]) -> torch.Tensor:
        assert self._backend is not None, "setup first"
        return self._backend.reference_logprobs(shard, plan)

    @names_gpu_out_of_memory("generate")
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], cfg: GenerationCfg, seed: int
    ) -> ShardGeneration | None:
        """Sample this rank's shard with the colocated engine (all ranks call together);
        None on a rank whose engine group's first rank samples for it."""
        from hpcrl.core.generation.engine import ShardGeneration, shard_seed

        assert self._place is not None and self._engine_group is not None, "setup first"
        started = time.perf_counter()
        engine = self._current_engine()
        if engine is None:
            return None
        refit_s = time.perf_counter() - started
        started = time.perf_counter()
        # One seed per data shard: per data-parallel rank, or per engine group.
        shard = (
            self._place.dp_rank
            if self._engine_group.ranks_per_engine == 1
            else self._engine_group.index
        )
        fields = engine.generate(prompt_ids, cfg, shard_seed(seed, shard))
        sample_s = time.perf_counter() - started
        metrics = {
            **engine.generation_metrics(),
            "time_refit_s": refit_s,
            "time_sample_s": sample_s,
        }
        return ShardGeneration(fields=fields, metrics=metrics)

    def _current_engine(self) -> GenerationEngine | None:
        """The engine, built on first use and holding the backend's current weights; None
        on a rank whose group's engine another rank holds (it still joins the refit)."""
        assert self._backend is not None and self._engine_group is not None, "setup first"
        if self._engine_spec is None:
            raise RuntimeError(
                "this run samples on separate generation workers "
                "(policy.generation.colocated.enabled: false); training workers hold no engine"
            )
        if self._engine is None and self._engine_group.leads:
            if self._engine_node is not None:
                os.makedirs(self._engine_node.refit_dir, exist_ok=True)
            self._engine = self._engine_spec.build(self._engine_devices, self._engine_node)
        elif (
            self._node_workers is None
            and self._engine_node is not None
            and self._engine_node.node_rank > 0
        ):
            # Node rank > 0: blocks until the group's engine and every node's workers start
            # (all ranks are in this call together).
            self._node_workers = self._engine_spec.build_node_workers(
                self._engine_devices, self._engine_node
            )
        # The engine's own label where this rank holds one (the torch engine starts with
        # none loaded); else the group's last refit, which its holder shares (a vLLM engine
        # starts at version 0 with the checkpoint's weights, as the trainer does).
        loaded = self._engine.weights_version if self._engine is not None else self._refitted
        if loaded != self._weights_version:
            weights = self._backend.export_hf_weights()  # a collective: every rank
            if self._engine is not None:
                self._engine.update_weights(weights)
                self._engine.weights_version = self._weights_version
            self._refitted = self._weights_version
        return self._engine

    @names_gpu_out_of_memory("put_hf_weights")
    def put_hf_weights(self) -> Any:
        """For separate generation workers: every rank gathers (a collective); rank 0 puts
        the weights into Ray's object store once and returns the reference, others None."""
        import ray
        import torch.distributed as dist

        assert self._backend is not None, "setup first"
        weights = [(name, t.detach().cpu()) for name, t in self._backend.export_hf_weights()]
        if dist.is_initialized() and dist.get_rank() != 0:
            return None
        return ray.put(weights)

    @names_gpu_out_of_memory("offload_optimizer")
    def offload_optimizer(self) -> None:
        """Before generation: optimizer state off the GPU, when the engine needs the room."""
        assert self._backend is not None, "setup first"
        if self._engine_needs_optimizer_memory():
            self._backend.offload_optimizer()

    @names_gpu_out_of_memory("onload_optimizer")
    def onload_optimizer(self) -> None:
        assert self._backend is not None, "setup first"
        if self._engine_needs_optimizer_memory():
            self._backend.onload_optimizer()

    def _engine_needs_optimizer_memory(self) -> bool:
        spec = self._engine_spec
        return spec is None or spec.needs_optimizer_memory

    @names_gpu_out_of_memory("save_checkpoint")
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        assert self._backend is not None, "setup first"
        self._backend.save_checkpoint(checkpoint_dir)

    @names_gpu_out_of_memory("load_checkpoint")
    def load_checkpoint(self, checkpoint_dir: str) -> None:
        assert self._backend is not None, "setup first"
        self._backend.load_checkpoint(checkpoint_dir)
        self._weights_version += 1
        self._optimizer_steps = int(self._backend.collect_state()["step"])

    def export_hf(self, out_dir: str) -> None:
        assert self._backend is not None, "setup first"
        self._backend.export_hf(out_dir)

    def gpu_memory_gb(self) -> tuple[float | None, float | None]:
        """(peak, capacity) in GiB for an out-of-memory report: the peak the backend reports
        (``collect_state``'s ``peak_memory_gb``) where it can, else CUDA's own."""
        peak, capacity = cuda_memory_gb()
        try:
            reported = (
                self._backend.collect_state().get("peak_memory_gb") if self._backend else None
            )
        except Exception:  # a backend whose setup ran out of memory may be half built
            reported = None
        if isinstance(reported, int | float) and reported > 0:
            peak = max(float(reported), peak or 0.0)
        return peak, capacity

    def collect_state(self) -> dict[str, Any]:
        """The backend's state, plus this rank's optimizer steps, its peak host memory (the
        driver sums the ranks' peaks: Ray workers are not the driver's child processes) and
        its pass figures since the last call (``pass_metrics``; the driver calls once per
        step), how torch.compile's caches answered so far (``compile_stats``), and the seconds
        its garbage collector took and the new CUDA segments its allocator asked for since the
        last call (``hpcrl.core.collection_clock``, ``allocator_counters``)."""
        assert self._backend is not None, "setup first"
        return {
            **self._backend.collect_state(),
            **compile_cache_counts(),
            "worker_optimizer_steps": self._optimizer_steps,
            "peak_host_rss_gb": self._host_memory.sample(),
            "pass_metrics": dict(self._backend.take_pass_metrics()),
            **self._collections.take("worker"),
            **self._allocations.take(),
        }
