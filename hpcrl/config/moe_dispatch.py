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

import operator
from collections.abc import Mapping

import attrs

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe
from hpcrl.config.shared_methods import SharedMethods

MEGATRON = "policy.megatron_cfg"
HYBRIDEP_PACK_MULTIPLE = 128
#: the recipe values this module reads; read one by one, so that no frame here holds the
#: Megatron section (tests/test_stage_boundaries.py counts the files that do)
_FIELDS = (
    "enabled", "moe_token_dispatcher_type", "moe_enable_deepep", "moe_flex_dispatcher_backend",
    "moe_shared_expert_overlap", "expert_model_parallel_size", "context_parallel_size",
    "tensor_model_parallel_size", "sequence_parallel", "hybridep_num_ranks_per_nvlink_domain",
    "hybridep_use_mnnvl",
)  # fmt: skip


@attrs.frozen(kw_only=True)
class FlexDispatch(SharedMethods):
    """The Megatron settings of MoE token dispatch, as plain values."""

    enabled: bool
    moe_token_dispatcher_type: str | None
    moe_enable_deepep: bool
    moe_flex_dispatcher_backend: str | None
    moe_shared_expert_overlap: bool
    expert_model_parallel_size: int
    context_parallel_size: int
    tensor_model_parallel_size: int
    sequence_parallel: bool
    hybridep_num_ranks_per_nvlink_domain: int | None
    hybridep_use_mnnvl: bool | None

    @classmethod
    def of(cls, recipe: Recipe) -> FlexDispatch:
        values = operator.attrgetter(*(f"policy.megatron_cfg.{name}" for name in _FIELDS))(recipe)
        return cls(**dict(zip(_FIELDS, values, strict=True)))

    @property
    def backend(self) -> str | None:
        """The flex dispatcher's kernels ("deepep" or "hybridep"), None without flex
        dispatch. megatron-core's default backend is deepep; moe_enable_deepep selects it."""
        if self.moe_token_dispatcher_type != "flex":
            return None
        if self.moe_enable_deepep:
            return "deepep"
        return self.moe_flex_dispatcher_backend or "deepep"

    @property
    def key(self) -> tuple[str, bool | str]:
        """The key (and its value) that chose the kernels, for messages."""
        if self.moe_enable_deepep:
            return f"{MEGATRON}.moe_enable_deepep", True
        if self.moe_flex_dispatcher_backend is not None:
            return f"{MEGATRON}.moe_flex_dispatcher_backend", self.moe_flex_dispatcher_backend
        return f"{MEGATRON}.moe_token_dispatcher_type", "flex"


def rule_flex_dispatcher(recipe: Recipe) -> list[Problem]:
    """What megatron-core's TransformerConfig refuses, at validate time instead of in every
    rank: DeepEP needs the flex dispatcher, and it is one backend or the other; the shared
    experts overlap only the alltoall dispatcher's communication."""
    flex = FlexDispatch.of(recipe)
    if not flex.enabled:
        return []
    dispatcher = flex.moe_token_dispatcher_type
    if flex.moe_shared_expert_overlap and dispatcher not in (None, "alltoall"):
        return [
            Problem(
                path=f"{MEGATRON}.moe_shared_expert_overlap",
                value=True,
                message="megatron-core overlaps the shared experts only with the alltoall "
                f"dispatcher's communication ({MEGATRON}.moe_token_dispatcher_type is "
                f"{dispatcher})",
                fix=f"set {MEGATRON}.moe_shared_expert_overlap=false, or "
                f"{MEGATRON}.moe_token_dispatcher_type=alltoall",
            )
        ]
    if not flex.moe_enable_deepep:
        return []
    if dispatcher != "flex":
        return [
            Problem(
                path=f"{MEGATRON}.moe_enable_deepep",
                value=True,
                message="DeepEP dispatches tokens only through megatron-core's flex dispatcher "
                f"({MEGATRON}.moe_token_dispatcher_type is {dispatcher or 'the provider default'})",
                fix=f"set {MEGATRON}.moe_token_dispatcher_type=flex, or "
                f"{MEGATRON}.moe_enable_deepep=false",
            )
        ]
    if flex.moe_flex_dispatcher_backend == "hybridep":
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


def hybridep_env(flex: FlexDispatch, environment: Mapping[str, str]) -> dict[str, str]:
    """HybridEP's NVLink-domain variables for the job (none without HybridEP): a key wins,
    then ``environment`` (what the job already exports), then NeMo RL's default."""
    if flex.backend != "hybridep":
        return {}
    ep = flex.expert_model_parallel_size
    mnnvl = flex.hybridep_use_mnnvl
    chosen = {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": flex.hybridep_num_ranks_per_nvlink_domain,
        "USE_MNNVL": None if mnnvl is None else int(mnnvl),
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
    flex = FlexDispatch.of(recipe)
    if recipe.backend != "megatron" or flex.backend != "hybridep":
        return 1
    multiple = HYBRIDEP_PACK_MULTIPLE
    if flex.context_parallel_size > 1:
        multiple *= 2 * flex.context_parallel_size
    if flex.sequence_parallel and flex.tensor_model_parallel_size > 1:
        multiple *= flex.tensor_model_parallel_size
    return multiple
