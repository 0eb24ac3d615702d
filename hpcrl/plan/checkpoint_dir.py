"""Where the Megatron backend keeps its one-time HF→Megatron conversions.

One function, used both by the planner (with the profile's env, i.e. as the job will see it)
and inside the job (with ``os.environ``), so the two can never disagree.
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
