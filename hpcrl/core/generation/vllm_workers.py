"""Non-colocated generation: vLLM engines in Ray actors of their own placement group.

``policy.generation.colocated.resources`` names the nodes and GPUs per node of the
generation side; each engine takes ``tensor_parallel_size × pipeline_parallel_size`` of
those GPUs, within one node (on CPU: one worker slot each). The planner decides which nodes (``JobSpec.generation.first_node``:
nodes of their own after the training ones, or the training nodes' remaining GPUs) and the
driver passes that here; Ray's GPU accounting keeps the two sides on different GPUs.
Without a plan (tests), the nodes after the training ones are used when the cluster has
enough of them, else the first ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.config.errors import ConfigError
from hpcrl.core.generation.engine import EngineSpec, GenerationEngine, ShardGeneration, shard_seed
from hpcrl.core.workers.group import NODE_ID_LABEL, worker_env
from hpcrl.plan.generation import engine_tiling_problem

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe


@attrs.frozen(kw_only=True)
class GenerationLayout:
    num_nodes: int
    engines_per_node: int
    gpus_per_engine: int  # 0 on CPU
    device: str
    cpus_per_engine: float = 0.25

    @property
    def num_engines(self) -> int:
        return self.num_nodes * self.engines_per_node


def generation_layout(recipe: Recipe, device: str, node_gpus: int = 0) -> GenerationLayout:
    """From ``colocated.resources``; unset fields default to the training side's shape.
    ``node_gpus``: GPUs of the job's largest node (``largest_node_gpus``), the most one engine
    can span. On GPUs the engines must tile each node's generation GPUs; the error is the
    planner's (``hpcrl.plan.generation.engine_tiling_problem``), for runs without a plan."""
    generation = recipe.policy.generation
    resources = generation.colocated.resources
    num_nodes = resources.num_nodes or recipe.cluster.num_nodes
    gpus_per_node = resources.gpus_per_node or recipe.cluster.gpus_per_node
    gpus_per_engine = generation.vllm_cfg.tensor_parallel_size * (
        generation.vllm_cfg.pipeline_parallel_size
    )
    if device == "cuda":
        problem = engine_tiling_problem(
            generation.vllm_cfg, gpus_per_node, node_gpus, "this job's Ray cluster"
        )
        if problem is not None:
            raise ConfigError([problem])
    return GenerationLayout(
        num_nodes=num_nodes,
        engines_per_node=gpus_per_node // gpus_per_engine if device == "cuda" else gpus_per_node,
        gpus_per_engine=gpus_per_engine if device == "cuda" else 0,
        device=device,
    )


def largest_node_gpus() -> int:
    """GPUs of the alive Ray node with the most (an engine's GPUs are those of one node)."""
    import ray

    return max(
        (int(node["Resources"].get("GPU", 0)) for node in ray.nodes() if node["Alive"]),
        default=0,
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

    def setup(self, spec: EngineSpec) -> int:
        self.engine = spec.build()
        return os.getpid()

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

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class GenerationGroup:
    """Start, feed, refit and stop the generation actors."""

    def __init__(self, layout: GenerationLayout, spec: EngineSpec) -> None:
        self.layout = layout
        self.spec = spec
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self.weights_version = 0  # the engines start from spec.model_path
        self._pending_updates: list[Any] = []
        self._placement_group: Any = None

    def start(
        self, training_num_nodes: int, timeout_s: float = 600.0, first_node: int | None = None
    ) -> None:
        """``first_node``: the planner's first generation node (``JobSpec.generation``)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._placement_group = self._reserve(training_num_nodes, timeout_s, first_node)
        bundle = self._bundle()
        remote_cls = ray.remote(GenerationWorker)
        env = worker_env(self.layout.device)
        self.actors = [
            remote_cls.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group, placement_group_bundle_index=index
                ),
            ).remote(env)
            for index in range(self.layout.num_engines)
        ]
        self.pids = ray.get([a.setup.remote(self.spec) for a in self.actors], timeout=timeout_s)

    def _bundle(self) -> dict[str, float]:
        if self.layout.device == "cuda":
            return {"GPU": float(self.layout.gpus_per_engine), "CPU": 1.0}
        return {"CPU": self.layout.cpus_per_engine}

    def _reserve(self, training_num_nodes: int, timeout_s: float, first_node: int | None) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        node_ids = generation_node_ids(training_num_nodes, self.layout.num_nodes, first_node)
        per_node = self.layout.engines_per_node
        indices = range(self.layout.num_engines)
        group = placement_group(
            [self._bundle() for _ in indices],
            strategy="PACK",
            bundle_label_selector=[{NODE_ID_LABEL: node_ids[i // per_node]} for i in indices],
        )
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(group)
            raise RuntimeError(
                f"could not place {self.layout.num_engines} vLLM engines "
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

        shards, num_real = pad_prompts_evenly(prompt_ids, len(self.actors))
        cfg_ref = ray.put(cfg)
        refs = [
            actor.generate.remote(shard, cfg_ref, shard_seed(seed, index))
            for index, (actor, shard) in enumerate(zip(self.actors, shards, strict=True))
        ]
        return PendingShards(refs=refs, num_real=num_real, weights_version=self.weights_version)

    def collect(self, pending: PendingShards) -> list[ShardGeneration]:
        """The engines' outputs of ``pending``, in prompt order (waits for them)."""
        import ray

        return ray.get(pending.refs)

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

    def wait_for_updates(self) -> None:
        import ray

        pending, self._pending_updates = self._pending_updates, []
        ray.get(pending)

    def shutdown(self) -> None:
        import ray

        try:
            if self.actors and self.pids:
                ray.get([actor.close.remote() for actor in self.actors], timeout=120)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
            if self._placement_group is not None:
                ray.util.remove_placement_group(self._placement_group)
                self._placement_group = None


def generation_node_ids(
    training_num_nodes: int, num_nodes: int, first_node: int | None = None
) -> list[str]:
    """Nodes ``first_node ..`` in the training group's node order (the plan's split; see
    ``hpcrl.plan.generation``). Without a plan: the nodes after the training ones when there
    are enough, else the first ones."""
    import ray

    from hpcrl.core.workers.group import pick_nodes

    if first_node is not None:
        return pick_nodes(first_node + num_nodes)[first_node:]

    alive = [node for node in ray.nodes() if node["Alive"]]
    if len(alive) >= training_num_nodes + num_nodes:
        ordered = pick_nodes(training_num_nodes + num_nodes)
        return ordered[training_num_nodes:]
    return pick_nodes(num_nodes)
