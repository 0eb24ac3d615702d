"""The reward-model scorer as a Ray actor of its own (NeMo RL runs its reward model on GPUs
carved out of the cluster, apart from the policy's): one actor on ``gpus`` GPUs on CUDA, or
on ``cpus`` CPU worker slots on CPU profiles. The controller calls ``score`` as it calls any
environment's.

Not started by the driver yet: recipes cannot name the reward-model environment until the
login side carves its GPUs out of ``cluster.gpus_per_node`` (hpcrl.config.node_split).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcrl.core.environments.reward_model_env import RewardModelEnvironment


class RewardModelActor:
    """A handle on the remote scorer; ``kwargs`` are RewardModelEnvironment's (no device)."""

    def __init__(
        self, kwargs: Mapping[str, Any], device: str, gpus: int = 1, cpus: float = 1.0
    ) -> None:
        import ray

        if device == "cuda":
            # one process sees all its GPUs; the scorer runs on the first (no RM parallelism)
            options: dict[str, Any] = {"num_gpus": gpus, "num_cpus": 1}
        else:
            options = {"num_gpus": 0, "num_cpus": cpus}
        remote_cls = ray.remote(RewardModelEnvironment)
        self.actor = remote_cls.options(**options).remote(**dict(kwargs), device=device)

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        import ray

        return list(ray.get(self.actor.score.remote(list(prompts), list(responses), list(answers))))

    def score_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, str]]]
    ) -> list[float]:
        import ray

        return list(
            ray.get(self.actor.score_conversations.remote([list(c) for c in conversations]))
        )

    def shutdown(self) -> None:
        import ray

        ray.kill(self.actor)
