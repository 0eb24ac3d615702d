"""Pick the reward environment named by ``env.name`` (plain Python, runs on the controller)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from hpcrl.config.recipe import EnvCfg


class Environment(Protocol):
    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        """One reward per response (same order)."""


def build_environment(cfg: EnvCfg, name: str | None = None) -> Environment:
    """The environment ``name`` (default ``env.name``; the driver passes
    hpcrl.config.datasets.data_env_name, which also reads NeMo RL's data.*.env_name) with
    ``env.kwargs`` as constructor arguments. NeMo RL's ``math_multi_reward`` also has
    ``score_components`` (its named rewards, for gdpo)."""
    from hpcrl.core.environments.math_env import MathEnvironment
    from hpcrl.core.environments.math_multi_reward_env import MathMultiRewardEnvironment
    from hpcrl.core.environments.toy_count import ToyCountEnvironment

    name = cfg.name if name is None else name
    if cfg.math is not None and name == "math":
        return _nemo_rl_math(cfg)
    classes: dict[str, Any] = {
        "math": MathEnvironment,
        "toy_count": ToyCountEnvironment,
        "math_multi_reward": MathMultiRewardEnvironment,
    }
    if name not in classes:
        raise ValueError(f"env.name: {name!r} is not one of {', '.join(sorted(classes))}")
    try:
        return classes[name](**cfg.kwargs)
    except TypeError as error:
        raise ValueError(
            f"env.kwargs: {dict(cfg.kwargs)!r} do not fit env {name!r}: {error}"
        ) from None


def _nemo_rl_math(cfg: EnvCfg) -> Environment:
    """NeMo RL's ``env.math``: ``math_verify_impl`` picks the checker."""
    from hpcrl.core.environments.math_env import MathEnvironment

    assert cfg.math is not None
    if cfg.math.math_verify_impl == "hpcrl_numeric":
        return MathEnvironment(**cfg.kwargs)
    if cfg.math.math_verify_impl == "dapo_math_verify":
        from hpcrl.core.environments.dapo_math_env import DapoMathEnvironment

        return DapoMathEnvironment()
    from hpcrl.core.environments.math_verify_env import MathVerifyEnvironment

    return MathVerifyEnvironment()
