"""A group of Ray actors, one per GPU (or CPU worker slot), forming one torch.distributed group.

Placement: one placement group whose bundle ``r`` is pinned (node-id label selector) to node
``r // workers_per_node``; node 0 is the driver's node, the others follow in IP order. Rank
0's node IP is MASTER_ADDR. Every call fans out to all actors and waits for all of them, so
a failure on any rank surfaces at the controller as ``WorkerFailed`` naming that rank (its
traceback is in the driver's log).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hpcrl.core.backends.base import DataParallelPlace, RankInfo
from hpcrl.core.workers.failures import WorkerFailed, get_all

NODE_ID_LABEL = "ray.io/node-id"
PROGRESS_EVERY_S = 30.0


def _quiet(message: str) -> None:
    del message


@attrs.frozen(kw_only=True)
class GroupLayout:
    """How many workers, where, on what device; and the planned paths every rank gets."""

    num_nodes: int
    workers_per_node: int
    device: str  # "cuda" | "cpu"
    cpus_per_worker: float = 0.25  # CPU path: fractional so several actors share few cores
    threads_per_worker: int = 1  # torch intra-op threads on the CPU path
    master_port: int | None = None  # None: a free port on rank 0's node
    megatron_checkpoint_dir: str | None = None  # JobSpec.megatron_checkpoint_dir (Megatron)
    engine_ranks: int = 1  # JobSpec.colocated_engine_ranks: ranks per colocated vLLM engine
    engine_refit_dir: str | None = None  # RankInfo.engine_refit_dir (engines across nodes)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.workers_per_node


def worker_env(device: str) -> dict[str, str]:
    """Environment every worker starts with."""
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if device == "cuda":
        # NVLink SHARP multicast is unavailable on the lent machines and fails NCCL init.
        env["NCCL_NVLS_ENABLE"] = "0"
    return env


def pick_nodes(num_nodes: int) -> list[str]:
    """Node ids for ranks' nodes: the driver's node first, then the others by IP."""
    import ray

    alive = [node for node in ray.nodes() if node["Alive"]]
    here = ray.get_runtime_context().get_node_id()
    alive.sort(key=lambda node: (node["NodeID"] != here, node["NodeManagerAddress"]))
    if len(alive) < num_nodes:
        seen = ", ".join(node["NodeManagerAddress"] for node in alive) or "none"
        raise RuntimeError(
            f"the job needs {num_nodes} Ray nodes but {len(alive)} joined the cluster "
            f"({seen}); check the per-node Ray logs in <run_dir>/logs/"
        )
    return [node["NodeID"] for node in alive[:num_nodes]]


def node_ip(node_id: str) -> str:
    """The address Ray itself uses for a node (the bootstrap's explicit node IP), which is
    where the other ranks can reach rank 0; not whatever the default route says."""
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node["NodeManagerAddress"]
    raise AssertionError(f"node {node_id} is not in the Ray cluster")


def _holds_error(ready: list[Any]) -> bool:
    import ray

    try:
        ray.get(ready, timeout=0)
    except ray.exceptions.RayError:
        return True
    return False


class RayWorkerGroup:
    """Start, call and stop the actors of one backend."""

    def __init__(
        self,
        layout: GroupLayout,
        worker_class_path: str,
        progress: Callable[[str], None] | None = None,
        actor_class: type | None = None,
    ) -> None:
        self.layout = layout
        self._worker_class_path = worker_class_path
        self._actor_class = actor_class
        self._progress = progress or _quiet
        self._placement_group: Any = None
        self.actors: list[Any] = []
        self.places: list[DataParallelPlace] = []
        self.rank_node_ips: list[str] = []  # the Ray node IP of each rank, for failures
        self.failed = False  # a call failed on some rank: the others may be stuck in it

    def start(self, recipe: Any, model_path: str, timeout_s: float = 600.0) -> None:
        """Place the actors, then set up every rank (process group + backend)."""
        started = time.monotonic()
        self._placement_group = self._reserve(timeout_s)
        self.actors = [self._spawn(rank) for rank in range(self.layout.world_size)]
        rank_infos = self._rank_infos()
        self._progress(
            f"{self.layout.world_size} workers placed; loading {model_path} and building "
            f"the process group (master {rank_infos[0].master_addr}:{rank_infos[0].master_port})"
        )
        refs = [
            actor.setup.remote(recipe, info, model_path, self.layout.threads_per_worker)
            for actor, info in zip(self.actors, rank_infos, strict=True)
        ]
        self.places = self._wait(refs, "setup", timeout_s)
        self._progress(
            f"{self.layout.world_size} workers ready in {time.monotonic() - started:.0f} s"
        )

    def _wait(self, refs: list[Any], what: str, timeout_s: float) -> list[Any]:
        """All results, with a progress line every PROGRESS_EVERY_S and a clear timeout; a
        rank that fails ends the wait at once (the others may wait for it in a collective)."""
        import ray

        started = time.monotonic()
        pending = list(refs)
        last_progress_s = started
        while pending:
            waited_s = time.monotonic() - started
            if waited_s >= timeout_s:
                raise TimeoutError(
                    f"{what}: {len(pending)} of {len(refs)} workers not done after "
                    f"{timeout_s:.0f} s; see the worker logs (Ray's logs/worker-*.err)"
                )
            ready, pending = ray.wait(
                pending, num_returns=1, timeout=min(PROGRESS_EVERY_S, timeout_s - waited_s)
            )
            if ready and _holds_error(ready):
                break  # _gather below raises WorkerFailed for it
            if pending and time.monotonic() - last_progress_s >= PROGRESS_EVERY_S:
                last_progress_s = time.monotonic()
                self._progress(
                    f"{what}: {len(refs) - len(pending)}/{len(refs)} workers done "
                    f"({last_progress_s - started:.0f} s)"
                )
        return self._gather(refs, what)

    def _gather(self, refs: list[Any], method: str, timeout_s: float | None = None) -> list[Any]:
        try:
            return get_all(refs, method, self.rank_node_ips, timeout_s=timeout_s)
        except WorkerFailed:
            self.failed = True
            raise

    def _reserve(self, timeout_s: float) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        node_ids = pick_nodes(self.layout.num_nodes)
        bundle = self._bundle()
        ranks = range(self.layout.world_size)
        ips = {node_id: node_ip(node_id) for node_id in node_ids}
        self.rank_node_ips = [ips[node_ids[rank // self.layout.workers_per_node]] for rank in ranks]
        self._progress(
            f"placing {self.layout.world_size} workers ({self.layout.workers_per_node} per node "
            f"on {self.layout.num_nodes} nodes, {bundle} each)"
        )
        group = placement_group(
            [dict(bundle) for _ in ranks],
            strategy="PACK",
            bundle_label_selector=[
                {NODE_ID_LABEL: node_ids[rank // self.layout.workers_per_node]} for rank in ranks
            ],
        )
        started = time.monotonic()
        while not ray.wait([group.ready()], timeout=PROGRESS_EVERY_S)[0]:
            waited_s = time.monotonic() - started
            if waited_s >= timeout_s:
                ray.util.remove_placement_group(group)
                raise RuntimeError(
                    f"could not place {self.layout.world_size} workers "
                    f"({self.layout.workers_per_node} per node on {self.layout.num_nodes} "
                    f"nodes, each {bundle}) within {timeout_s:.0f} s; Ray has "
                    f"{ray.available_resources()} available"
                )
            self._progress(
                f"still waiting for resources for {self.layout.world_size} workers "
                f"({waited_s:.0f} s); Ray has {ray.available_resources()} available"
            )
        return group

    def _bundle(self) -> dict[str, float]:
        if self.layout.device == "cuda":
            return {"GPU": 1.0, "CPU": 1.0}
        return {"CPU": self.layout.cpus_per_worker}

    def _spawn(self, rank: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from hpcrl.core.workers.actor import TrainingWorker

        bundle = self._bundle()
        remote_cls = ray.remote(self._actor_class or TrainingWorker)
        return remote_cls.options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group, placement_group_bundle_index=rank
            ),
            name=None,
        ).remote(self._worker_class_path, worker_env(self.layout.device))

    def _rank_infos(self) -> list[RankInfo]:
        import ray

        master_addr = node_ip(ray.get(self.actors[0].node_id.remote()))
        master_port = self.layout.master_port or ray.get(self.actors[0].pick_free_port.remote())
        per_node = self.layout.workers_per_node
        return [
            RankInfo(
                rank=rank,
                world_size=self.layout.world_size,
                local_rank=rank % per_node,
                local_world_size=per_node,
                node_rank=rank // per_node,
                master_addr=master_addr,
                master_port=master_port,
                device=self.layout.device,
                megatron_checkpoint_dir=self.layout.megatron_checkpoint_dir,
                engine_ranks=self.layout.engine_ranks,
                engine_refit_dir=self.layout.engine_refit_dir,
            )
            for rank in range(self.layout.world_size)
        ]

    # ------------------------------------------------------------------ calls
    def call_all(
        self,
        method: str,
        per_rank_args: Sequence[tuple[Any, ...]] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """``method(*per_rank_args[rank])`` on every actor; results in rank order."""
        args = per_rank_args or [()] * len(self.actors)
        assert len(args) == len(self.actors), "one argument tuple per rank"
        refs = [
            getattr(actor, method).remote(*a) for actor, a in zip(self.actors, args, strict=True)
        ]
        return self._gather(refs, method, timeout_s)

    def call_same(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """The same arguments to every rank (put once into the object store)."""
        import ray

        arg_refs = tuple(ray.put(a) for a in args)
        return self.call_all(method, [arg_refs] * len(self.actors), timeout_s=timeout_s)

    def shutdown(self, timeout_s: float = 120.0) -> None:
        """Workers free model/optimizer and destroy the process group, then are killed.

        After a failed call they are only killed: the ranks that did not fail may be blocked
        in a collective with the one that did, and a ``close`` would queue behind it. Workers
        that cannot close are killed all the same; their error is printed, never raised over
        the one that brought the driver here."""
        import ray

        try:
            if self.actors and self.places and not self.failed:
                self.call_all("close", timeout_s=timeout_s)
        except (WorkerFailed, ray.exceptions.GetTimeoutError) as error:
            print(f"workers did not close cleanly ({error}); killing them", flush=True)
        finally:
            release_actors(self.actors, self._placement_group)
            self.actors, self._placement_group = [], None
            # Give the raylet a moment to reap the killed worker processes.
            time.sleep(0.2)


def release_actors(actors: Sequence[Any], placement_group: Any) -> None:
    """Kill ``actors`` and remove the placement group they ran in (None: none was made);
    the training group's and the generation engines' shutdown both end here."""
    import ray

    for actor in actors:
        ray.kill(actor)
    if placement_group is not None:
        ray.util.remove_placement_group(placement_group)
