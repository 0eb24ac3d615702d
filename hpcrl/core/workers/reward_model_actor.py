"""The reward-model environment's scorers, in Ray actors of their own placement group: one
per GPU (CPU worker slot on CPU profiles) of ``JobSpec.reward_model``, on the nodes the plan
carved out for them (``hpcrl.config.node_split``), as NeMo RL runs its reward model on GPUs
apart from the policy's. Each holds the whole model; a batch of conversations is split into
contiguous, near-equal shares, one per scorer, and the rewards come back in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpcrl.core.environments.reward_model_env import RewardModelEnvironment, reward_metrics
from hpcrl.core.workers.failures import get_all
from hpcrl.core.workers.group import NODE_ID_LABEL, release_actors, worker_env

if TYPE_CHECKING:
    from hpcrl.config.recipe import RewardModelEnvCfg
    from hpcrl.run.jobspec import JobSpec, RewardModelPlacement

ROLE = "reward-model scorer"  # how a failure names one (WorkerFailed)
CPUS_PER_SCORER_ON_CPU = 0.25  # a share of a slot: the policy's ranks keep theirs


def scorer_kwargs(section: RewardModelEnvCfg, model_path: str) -> dict[str, Any]:
    """RewardModelEnvironment's arguments from ``env.reward_model`` (``model_path``: its
    model_name resolved for this node)."""
    return {
        "model_path": model_path,
        "tokenizer_path": section.tokenizer.name or model_path,
        "precision": section.precision,
        "batch_size": section.batch_size,
        "max_model_len": section.max_model_len,
    }


class _Scorer(RewardModelEnvironment):
    """A scorer started with the job's worker environment (wrapped by ``ray.remote``)."""

    def __init__(self, env: Mapping[str, str], **kwargs: Any) -> None:
        import os

        os.environ.update(env)
        super().__init__(**kwargs)


class RewardModelScorers:
    """Start, feed and stop the scorers; ``score`` is the environment interface."""

    def __init__(
        self, kwargs: Mapping[str, Any], placement: RewardModelPlacement, device: str
    ) -> None:
        self.kwargs = dict(kwargs)  # RewardModelEnvironment's, without device
        self.placement = placement
        self.device = device
        self.actors: list[Any] = []
        self._group: Any = None
        self.last_metrics: dict[str, float] = {}

    def _bundle(self) -> dict[str, float]:
        if self.device == "cuda":
            return {"GPU": 1.0, "CPU": 1.0}
        return {"CPU": CPUS_PER_SCORER_ON_CPU}

    def start(self, timeout_s: float = 600.0) -> RewardModelScorers:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._group = self._reserve(timeout_s)
        bundle = self._bundle()
        remote_cls = ray.remote(_Scorer)
        self.actors = [
            remote_cls.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._group, placement_group_bundle_index=index
                ),
            ).remote(worker_env(self.device), device=self.device, **self.kwargs)
            for index in range(self.placement.num_scorers)
        ]
        # a model that cannot load fails here, with its cause, before any rollout
        get_all([a.__ray_ready__.remote() for a in self.actors], "start", role=ROLE,
                timeout_s=timeout_s)  # fmt: skip
        return self

    def _reserve(self, timeout_s: float) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        from hpcrl.core.workers.group import pick_nodes

        first, count = self.placement.first_node, self.placement.num_nodes
        node_ids = pick_nodes(first + count)[first:]
        per_node = self.placement.slots_per_node
        indices = range(self.placement.num_scorers)
        group = placement_group(
            [self._bundle() for _ in indices],
            strategy="PACK",
            bundle_label_selector=[{NODE_ID_LABEL: node_ids[i // per_node]} for i in indices],
        )
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(group)
            raise RuntimeError(
                f"could not place {self.placement.num_scorers} reward-model scorers "
                f"({per_node} per node from node {first}, each {self._bundle()}) within "
                f"{timeout_s:.0f} s; Ray has {ray.available_resources()}. Check "
                "env.reward_model.resources against the allocation"
            )
        return group

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        """One reward per response (same order): each scorer scores a contiguous share."""
        rows = list(zip(prompts, responses, answers, strict=True))
        shares = _contiguous_shares(len(rows), len(self.actors))
        refs = [
            actor.score.remote(*(list(column) for column in zip(*rows[start:stop], strict=True)))
            for actor, (start, stop) in zip(self.actors, shares, strict=True)
            if stop > start
        ]
        rewards = [reward for share in get_all(refs, "score", role=ROLE) for reward in share]
        self.last_metrics = reward_metrics(rewards)
        return rewards

    def shutdown(self) -> None:
        release_actors(self.actors, self._group)
        self.actors, self._group = [], None


def start_scorers(jobspec: JobSpec, device: str) -> RewardModelScorers:
    """The job's scorers (``JobSpec.reward_model``), started."""
    from hpcrl.core.models.tiny import resolve_model_path

    placement, section = jobspec.reward_model, jobspec.recipe.env.reward_model
    assert placement is not None and section is not None, "planned for env.reward_model only"
    kwargs = scorer_kwargs(section, resolve_model_path(section.model_name))
    return RewardModelScorers(kwargs, placement, device).start()


def _contiguous_shares(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` (start, stop) ranges covering ``range(count)`` in order, sizes within one."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
