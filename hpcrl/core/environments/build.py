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


def build_environment(cfg: EnvCfg) -> Environment:
    """The environment for ``env.name`` with ``env.kwargs`` as constructor arguments."""
    from hpcrl.core.environments.math_env import MathEnvironment
    from hpcrl.core.environments.toy_count import ToyCountEnvironment

    if cfg.math is not None and cfg.name == "math":
        return _nemo_rl_math(cfg)
    classes: dict[str, Any] = {"math": MathEnvironment, "toy_count": ToyCountEnvironment}
    if cfg.name not in classes:
        raise ValueError(f"env.name: {cfg.name!r} is not one of {', '.join(sorted(classes))}")
    try:
        return classes[cfg.name](**cfg.kwargs)
    except TypeError as error:
        raise ValueError(
            f"env.kwargs: {dict(cfg.kwargs)!r} do not fit env {cfg.name!r}: {error}"
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
