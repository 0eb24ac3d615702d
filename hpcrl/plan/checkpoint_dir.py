"""Where the Megatron backend keeps its one-time HF→Megatron conversions.

Decided once, at plan time, from the job's environment as the script sets it (the profile's
env and the recipe's ``policy.megatron_cfg.env_vars``); the job converts into the planned
``JobSpec.megatron_checkpoint_dir`` and never resolves it again, so the directory the plan
checked against the container mounts is the one the job uses.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping


def resolve_megatron_checkpoint_dir(env: Mapping[str, str], home: str) -> tuple[str, str]:
    """Return ``(directory, source)`` following NeMo RL's precedence.

    ``NRL_MEGATRON_CHECKPOINT_DIR`` > ``$HF_HOME/nemo_rl`` > ``<home>/.cache/huggingface/nemo_rl``.
    ``source`` names which rule applied ("NRL_MEGATRON_CHECKPOINT_DIR", "HF_HOME" or "home").
    """
    explicit = env.get("NRL_MEGATRON_CHECKPOINT_DIR", "")
    if explicit:
        return explicit, "NRL_MEGATRON_CHECKPOINT_DIR"
    hf_home = env.get("HF_HOME", "")
    if hf_home:
        return posixpath.join(hf_home, "nemo_rl"), "HF_HOME"
    return posixpath.join(home, ".cache", "huggingface", "nemo_rl"), "home"
