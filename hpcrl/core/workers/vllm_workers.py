"""Non-colocated generation: engines (vLLM's, or hpcrl's torch sampler for Megatron
generation) in Ray actors of their own placement group.

``policy.generation.colocated.resources`` names the nodes and GPUs per node of the
generation side; each engine takes ``tensor_parallel_size × pipeline_parallel_size`` of
those GPUs, within one node (on CPU: one worker slot each), or, larger than a node, whole
nodes (``nodes_per_engine``): the engine's actor on its first node runs vLLM across them
(node rank 0), an ``EngineNodeActor`` on each other node that node's workers
(``hpcrl.core.generation.vllm_nodes``); refits go through files in the run folder. The
planner decides all of it (``JobSpec.generation``: which nodes, from ``first_node`` — nodes
of their own after the training ones, or the training nodes' remaining GPUs — and how many
engines of how many GPUs; ``hpcrl.plan.generation`` checks that they tile the nodes) and the
driver passes that placement here; Ray's GPU accounting keeps the two sides on different
GPUs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.core.generation.engine import EngineSpec, GenerationEngine, ShardGeneration, shard_seed
from hpcrl.core.workers.failures import get_all
from hpcrl.core.workers.group import NODE_ID_LABEL, release_actors, worker_env

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg
    from hpcrl.core.generation.engine_devices import EngineNodeRank
    from hpcrl.core.generation.vllm_nodes import EngineNodeWorkers
    from hpcrl.run.jobspec import GenerationPlacement

ENGINE_ROLE = "generation engine"  # how a failure names one (WorkerFailed)
REFIT_GROUP = "refit"  # the engine actors' concurrency group of in-flight refits


@attrs.frozen(kw_only=True)
class GenerationLayout:
    first_node: int  # the job's node order: node 0 is the driver's
    num_nodes: int
    engines_per_node: int
    gpus_per_engine: int  # 0 on CPU
    device: str
    cpus_per_engine: float = 0.25
    nodes_per_engine: int = 1  # > 1: one engine across whole nodes (engines_per_node 1)

    @property
    def num_engines(self) -> int:
        return self.num_nodes * self.engines_per_node // self.nodes_per_engine


def generation_layout(placement: GenerationPlacement, device: str) -> GenerationLayout:
    """The engines as planned (``JobSpec.generation``); the planner already checked that
    engines of ``slots_per_engine`` tile ``slots_per_node`` (CPU engines take one slot), or
    that engines across nodes take whole nodes (each node's actor: the node's GPUs)."""
    per_node = placement.slots_per_node
    if placement.nodes_per_engine > 1:
        return GenerationLayout(
            first_node=placement.first_node,
            num_nodes=placement.num_nodes,
            engines_per_node=1,
            gpus_per_engine=per_node if device == "cuda" else 0,
            device=device,
            nodes_per_engine=placement.nodes_per_engine,
        )
    return GenerationLayout(
        first_node=placement.first_node,
        num_nodes=placement.num_nodes,
        engines_per_node=per_node // placement.slots_per_engine,
        gpus_per_engine=placement.slots_per_engine if device == "cuda" else 0,
        device=device,
    )


@attrs.frozen(kw_only=True)
class PendingShards:
    """A submitted generation: one Ray reference per engine shard."""

    refs: list[Any]
    num_real: int  # prompts before padding to equal shards
    weights_version: int  # the weights version the engines sample with


class GenerationWorker:
    """One engine in one Ray actor (wrapped with ``ray.remote`` by ``GenerationGroup``)."""

    def __init__(self, env: dict[str, str]) -> None:
        os.environ.update(env)
        self.engine: GenerationEngine | None = None

    def setup(self, spec: EngineSpec, node: EngineNodeRank | None = None) -> int:
        """``node``: node rank 0 of an engine across nodes (its refit folder is made here)."""
        if node is not None:
            os.makedirs(node.refit_dir, exist_ok=True)
        self.engine = spec.build(node=node)
        return os.getpid()

    def engine_address(self) -> tuple[str, int]:
        """Where an engine across nodes meets the other nodes' workers: this node's address
        and a port free on it."""
        import socket

        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), int(sock.getsockname()[1])

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], cfg: GenerationCfg, seed: int
    ) -> ShardGeneration:
        assert self.engine is not None, "setup first"
        started = time.perf_counter()
        fields = self.engine.generate(prompt_ids, cfg, seed)
        metrics = {
            **self.engine.generation_metrics(),
            "time_sample_s": time.perf_counter() - started,
        }
        return ShardGeneration(fields=fields, metrics=metrics)

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        assert self.engine is not None, "setup first"
        self.engine.update_weights(named_tensors)

    def update_weights_in_flight(
        self, named_tensors: list[tuple[str, torch.Tensor]], recompute_kv_cache: bool
    ) -> bool:
        """Runs in the actor's ``refit`` concurrency group, beside a running ``generate``
        (``hpcrl.core.generation.in_flight``); True when a generation was running."""
        assert self.engine is not None, "setup first"
        refit = getattr(self.engine, "update_weights_in_flight", None)
        assert refit is not None, f"{type(self.engine).__name__} has no in-flight refit"
        return bool(refit(named_tensors, recompute_kv_cache))

    def decode_steps(self) -> int:
        """Steps the running (or last) generation has taken; called in the ``refit``
        group, beside it (how a caller sees a generation under way)."""
        in_flight = getattr(self.engine, "in_flight", None)
        return 0 if in_flight is None else int(in_flight.steps)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class EngineNodeActor:
    """The workers of one node rank > 0 of an engine across generation nodes (wrapped with
    ``ray.remote`` by ``GenerationGroup``); the engine's ``GenerationWorker`` drives them."""

    def __init__(self, env: dict[str, str]) -> None:
        os.environ.update(env)
        self.workers: EngineNodeWorkers | None = None

    def setup(self, spec: EngineSpec, node: EngineNodeRank) -> int:
        """Blocks until the engine and every node's workers have started (call it beside
        the engine's ``setup``)."""
        self.workers = spec.build_node_workers(None, node)
        return os.getpid()

    def close(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()
            self.workers = None


class GenerationGroup:
    """Start, feed, refit and stop the generation actors."""

    def __init__(
        self, layout: GenerationLayout, spec: EngineSpec, refit_dir: str | None = None
    ) -> None:
        """``refit_dir``: a folder every generation node sees (engines across nodes)."""
        assert layout.nodes_per_engine == 1 or refit_dir is not None, "engines across nodes"
        self.layout = layout
        self.spec = spec
        self.refit_dir = refit_dir
        self.actors: list[Any] = []  # one per engine: where generate and refits go
        self.node_actors: list[Any] = []  # the other nodes of engines across nodes
        self.pids: list[int] = []
        # vLLM engines start from spec.model_path's weights; the torch engine with none, so
        # the first generation waits for a refit (NeMo RL syncs its dedicated Megatron
        # inference model from the policy at setup, too)
        self.weights_version = 0 if spec.backend == "vllm" else -1
        self._pending_updates: list[Any] = []
        self._pending_in_flight = False  # the pending updates run beside generations
        self._placement_group: Any = None

    def start(self, timeout_s: float = 600.0) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._placement_group = self._reserve(timeout_s)
        bundle = self._bundle()
        # generate and update_weights run one at a time, in submission order (the default
        # group); an in-flight refit runs beside them in a group of its own.
        engine_cls = ray.remote(concurrency_groups={REFIT_GROUP: 1})(GenerationWorker)
        env = worker_env(self.layout.device)

        def place(cls: Any, index: int) -> Any:
            return cls.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group, placement_group_bundle_index=index
                ),
            ).remote(env)

        span = self.layout.nodes_per_engine
        self.actors = [place(engine_cls, k * span) for k in range(self.layout.num_engines)]
        if span == 1:
            setups = [a.setup.remote(self.spec) for a in self.actors]
        else:
            setups = self._start_across_nodes(place, timeout_s)
        self.pids = get_all(setups, "setup", timeout_s=timeout_s, role=ENGINE_ROLE)

    def _start_across_nodes(self, place: Any, timeout_s: float) -> list[Any]:
        """Engines across nodes: each engine's actor (node rank 0) and, on each of its other
        nodes, an ``EngineNodeActor``, all set up side by side (each waits for the others)."""
        import ray

        from hpcrl.core.generation.engine_devices import EngineNodeRank

        span, refit_dir = self.layout.nodes_per_engine, self.refit_dir
        assert refit_dir is not None
        addresses = get_all(
            [a.engine_address.remote() for a in self.actors], "engine_address",
            timeout_s=timeout_s, role=ENGINE_ROLE,
        )  # fmt: skip
        node_cls = ray.remote(EngineNodeActor)
        setups = []
        for k, (actor, (addr, port)) in enumerate(zip(self.actors, addresses, strict=True)):
            first = EngineNodeRank(
                nnodes=span, node_rank=0, master_addr=addr, master_port=port,
                refit_dir=refit_dir,
            )  # fmt: skip
            setups.append(actor.setup.remote(self.spec, first))
            for rank in range(1, span):
                node_actor = place(node_cls, k * span + rank)
                self.node_actors.append(node_actor)
                node = attrs.evolve(first, node_rank=rank)
                setups.append(node_actor.setup.remote(self.spec, node))
        return setups

    def _bundle(self) -> dict[str, float]:
        if self.layout.device == "cuda":
            return {"GPU": float(self.layout.gpus_per_engine), "CPU": 1.0}
        return {"CPU": self.layout.cpus_per_engine}

    def _reserve(self, timeout_s: float) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        node_ids = generation_node_ids(self.layout.first_node, self.layout.num_nodes)
        per_node = self.layout.engines_per_node
        # One bundle per engine, or per node of an engine across nodes (engine k's on
        # bundles k·span .. k·span + span - 1, one per node).
        indices = range(self.layout.num_engines * self.layout.nodes_per_engine)
        group = placement_group(
            [self._bundle() for _ in indices],
            strategy="PACK",
            bundle_label_selector=[{NODE_ID_LABEL: node_ids[i // per_node]} for i in indices],
        )
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(group)
            raise RuntimeError(
                f"could not place {self.layout.num_engines} generation engines "
                f"({per_node} per node on {self.layout.num_nodes} nodes, each "
                f"{self._bundle()}) within {timeout_s:.0f} s; Ray has "
                f"{ray.available_resources()}. Check policy.generation.colocated.resources "
                "against the allocation"
            )
        return group

    def submit(self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int) -> PendingShards:
        """Shard over the engines and start sampling; returns at once (``collect`` waits).
        Each engine runs its calls in submission order, so a later ``update_weights`` never
        changes the weights under a generation submitted before it."""
        import ray

        from hpcrl.core.workers.sharding import pad_prompts_evenly

        if self._pending_in_flight:
            # An in-flight refit is not ordered with generations: it must have landed before
            # this one starts, or its first tokens would come from older weights than it records.
            self.wait_for_updates()
        shards, num_real = pad_prompts_evenly(prompt_ids, len(self.actors))
        cfg_ref = ray.put(cfg)
        refs = [
            actor.generate.remote(shard, cfg_ref, shard_seed(seed, index))
            for index, (actor, shard) in enumerate(zip(self.actors, shards, strict=True))
        ]
        return PendingShards(refs=refs, num_real=num_real, weights_version=self.weights_version)

    def collect(self, pending: PendingShards) -> list[ShardGeneration]:
        """The engines' outputs of ``pending``, in prompt order (waits for them)."""
        return get_all(pending.refs, "generate", role=ENGINE_ROLE)

    def generate(
        self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int
    ) -> tuple[list[ShardGeneration], int]:
        pending = self.submit(prompt_ids, cfg, seed)
        return self.collect(pending), pending.num_real

    def update_weights(self, weights_ref: Any, version: int) -> None:
        """Every engine loads the weights behind ``weights_ref`` (one object-store copy).
        Queued behind the engines' earlier calls; does not wait (errors surface at the next
        ``update_weights`` or ``wait_for_updates``)."""
        self.wait_for_updates()
        self._pending_updates = [a.update_weights.remote(weights_ref) for a in self.actors]
        self.weights_version = version

    def update_weights_in_flight(
        self, weights_ref: Any, version: int, recompute_kv_cache: bool
    ) -> None:
        """Every engine loads the weights behind ``weights_ref`` at the next step of the
        generation it is running (or at once when idle), not behind the generations
        submitted before; does not wait (as ``update_weights``)."""
        self.wait_for_updates()
        self._pending_updates = [
            a.update_weights_in_flight.options(concurrency_group=REFIT_GROUP).remote(
                weights_ref, recompute_kv_cache
            )
            for a in self.actors
        ]
        self._pending_in_flight = True
        self.weights_version = version

    def wait_for_updates(self) -> None:
        pending, self._pending_updates = self._pending_updates, []
        self._pending_in_flight = False
        get_all(pending, "update_weights", role=ENGINE_ROLE)

    def shutdown(self) -> None:
        import ray

        # An engine across nodes and its other nodes' workers stop side by side (each
        # would wait seconds for the other's workers otherwise).
        actors = [*self.actors, *self.node_actors]
        try:
            if actors and self.pids:
                ray.get([actor.close.remote() for actor in actors], timeout=120)
        except ray.exceptions.RayError as error:  # never raised over the failure that got here
            print(f"generation engines did not close cleanly ({error}); killing them", flush=True)
        finally:
            release_actors(actors, self._placement_group)
            self.actors, self.node_actors, self._placement_group = [], [], None


def generation_node_ids(first_node: int, num_nodes: int) -> list[str]:
    """Nodes ``first_node .. first_node + num_nodes - 1`` in the training group's node order
    (the plan's split; see ``hpcrl.plan.generation``)."""
    from hpcrl.core.workers.group import pick_nodes

    return pick_nodes(first_node + num_nodes)[first_node:]
