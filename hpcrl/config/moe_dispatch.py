"""megatron-core's flex token dispatcher, as NeMo RL sets it up: its DeepEP or HybridEP kernels
move the routed tokens between expert-parallel ranks (the tokens and results are those of the
alltoall dispatcher; the kernels are CUDA-only, from DeepEP's ``deep_ep`` package).

- ``policy.megatron_cfg.moe_token_dispatcher_type: flex`` with ``moe_enable_deepep: true``
  (megatron-core's older switch) or ``moe_flex_dispatcher_backend: deepep|hybridep``; hpcrl
  passes them to megatron-core's provider (``hpcrl.core.backends.megatron.provider``).
- HybridEP reads its NVLink domain from the environment, which NeMo RL sets before building
  the model: ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` (``hybridep_num_ranks_per_nvlink_domain``,
  else min(EP, 64)) and ``USE_MNNVL`` (``hybridep_use_mnnvl``, else EP > 4); a key wins over
  the environment, the environment (profile env, env_vars) over the default. hpcrl puts them
  in the job's environment at plan time (``hybridep_env``), so job.sbatch shows them.
- HybridEP packs: NeMo RL pads each packed micro-batch to a multiple of 128 (× 2·CP, × TP under
  sequence parallelism); ``pack_multiple`` is that multiple for ``hpcrl.core.workers.micro_batches``.
- The job's preflight holds the node to the kernels (``JobSpec.machine_needs``).
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import MegatronCfg, Recipe

MEGATRON = "policy.megatron_cfg"
HYBRIDEP_PACK_MULTIPLE = 128


def flex_backend(cfg: MegatronCfg) -> str | None:
    """The flex dispatcher's kernels ("deepep" or "hybridep"), None without flex dispatch.
    megatron-core's default backend is deepep; ``moe_enable_deepep`` selects it too."""
    if cfg.moe_token_dispatcher_type != "flex":
        return None
    if cfg.moe_enable_deepep:
        return "deepep"
    return cfg.moe_flex_dispatcher_backend or "deepep"


def flex_key(cfg: MegatronCfg) -> tuple[str, bool | str]:
    """The key (and its value) that chose the kernels, for messages."""
    if cfg.moe_enable_deepep:
        return f"{MEGATRON}.moe_enable_deepep", True
    if cfg.moe_flex_dispatcher_backend is not None:
        return f"{MEGATRON}.moe_flex_dispatcher_backend", cfg.moe_flex_dispatcher_backend
    return f"{MEGATRON}.moe_token_dispatcher_type", "flex"


def rule_flex_dispatcher(recipe: Recipe) -> list[Problem]:
    """What megatron-core's TransformerConfig refuses, at validate time instead of in every
    rank: DeepEP needs the flex dispatcher, and it is one backend or the other; the shared
    experts overlap only the alltoall dispatcher's communication."""
    cfg = recipe.policy.megatron_cfg
    if not cfg.enabled:
        return []
    if cfg.moe_shared_expert_overlap and cfg.moe_token_dispatcher_type not in (None, "alltoall"):
        return [
            Problem(
                path=f"{MEGATRON}.moe_shared_expert_overlap",
                value=True,
                message="megatron-core overlaps the shared experts only with the alltoall "
                f"dispatcher's communication ({MEGATRON}.moe_token_dispatcher_type is "
                f"{cfg.moe_token_dispatcher_type})",
                fix=f"set {MEGATRON}.moe_shared_expert_overlap=false, or "
                f"{MEGATRON}.moe_token_dispatcher_type=alltoall",
            )
        ]
    if not cfg.moe_enable_deepep:
        return []
    if cfg.moe_token_dispatcher_type != "flex":
        return [
            Problem(
                path=f"{MEGATRON}.moe_enable_deepep",
                value=True,
                message="DeepEP dispatches tokens only through megatron-core's flex dispatcher "
                f"({MEGATRON}.moe_token_dispatcher_type is "
                f"{cfg.moe_token_dispatcher_type or 'the provider default'})",
                fix=f"set {MEGATRON}.moe_token_dispatcher_type=flex, or "
                f"{MEGATRON}.moe_enable_deepep=false",
            )
        ]
    if cfg.moe_flex_dispatcher_backend == "hybridep":
        return [
            Problem(
                path=f"{MEGATRON}.moe_enable_deepep",
                value=True,
                message=f"selects DeepEP while {MEGATRON}.moe_flex_dispatcher_backend is "
                "hybridep: the flex dispatcher runs one backend",
                fix=f"remove {MEGATRON}.moe_enable_deepep (megatron-core deprecates it) and keep "
                f"{MEGATRON}.moe_flex_dispatcher_backend",
            )
        ]
    return []


def hybridep_env(cfg: MegatronCfg, environment: Mapping[str, str]) -> dict[str, str]:
    """HybridEP's NVLink-domain variables for the job (none without HybridEP): a key wins,
    then ``environment`` (what the job already exports), then NeMo RL's default."""
    if flex_backend(cfg) != "hybridep":
        return {}
    ep = cfg.expert_model_parallel_size
    chosen = {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": cfg.hybridep_num_ranks_per_nvlink_domain,
        "USE_MNNVL": None if cfg.hybridep_use_mnnvl is None else int(cfg.hybridep_use_mnnvl),
    }
    defaults = {"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": min(ep, 64), "USE_MNNVL": int(ep > 4)}
    env = {}
    for name, value in chosen.items():
        if value is not None:
            env[name] = str(value)
        elif name not in environment:
            env[name] = str(defaults[name])
    return env


def pack_multiple(recipe: Recipe) -> int:
    """What each packed micro-batch's length is padded to a multiple of for HybridEP (1
    otherwise), as NeMo RL pads it."""
    cfg = recipe.policy.megatron_cfg
    if recipe.backend != "megatron" or flex_backend(cfg) != "hybridep":
        return 1
    multiple = HYBRIDEP_PACK_MULTIPLE
    if cfg.context_parallel_size > 1:
        multiple *= 2 * cfg.context_parallel_size
    if cfg.sequence_parallel and cfg.tensor_model_parallel_size > 1:
        multiple *= cfg.tensor_model_parallel_size
    return multiple
