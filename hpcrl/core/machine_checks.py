"""What this machine must have for the planned job: CUDA for a GPU plan, and what the plan
recorded the job's settings need (``JobSpec.machine_needs``, decided by
``hpcrl.plan.machine_needs``): Transformer Engine for the Megatron settings megatron-core
implements only with it, DeepEP's kernels for its flex dispatcher, a GPU plan for those it
implements only on GPUs.

Checked once per node by the job's preflight (``hpcrl.job.preflight``) before Ray starts,
from the typed ``JobSpec`` alone, and by ``python -m hpcrl.core.driver`` started by hand (no
preflight runs before it). Workers check nothing of it again: a setting that cannot run here
fails in seconds with its key and the fix, never inside every rank.

Whether a setting needs CUDA is decided by the planned device (``JobSpec.device``), not by
what torch finds: a CPU plan runs on CPU even on a GPU node (``hpcrl.core.driver.job_device``).
"""

from __future__ import annotations

from collections.abc import Callable

from hpcrl.config.errors import Problem
from hpcrl.core.backends.megatron.offload import te_available
from hpcrl.run.jobspec import JobSpec


def cuda_is_available() -> bool:
    import torch  # only for a GPU plan; the preflight has found torch by then

    return torch.cuda.is_available()


def deep_ep_has(name: str) -> bool:
    """Whether DeepEP's ``deep_ep`` package here provides ``name`` (``Buffer``, or
    ``HybridEPBuffer`` in its hybrid-ep build), as megatron-core imports them."""
    try:
        import deep_ep
    except ImportError:
        return False
    return hasattr(deep_ep, name)


#: the machine need → what deep_ep must provide
_DEEP_EP_NAMES = {"deep_ep": "Buffer", "hybrid_ep": "HybridEPBuffer"}


def machine_problems(
    jobspec: JobSpec,
    cuda_available: Callable[[], bool] = cuda_is_available,
    transformer_engine: Callable[[], bool] = te_available,
    deep_ep: Callable[[str], bool] = deep_ep_has,
) -> list[Problem]:
    """Every reason this node cannot run ``jobspec``, each naming the key, its value and
    the fix; empty when it can. The probes are injectable (tests)."""
    problems = []
    if jobspec.device == "gpu" and not cuda_available():
        problems.append(
            Problem(
                path="device",
                value="gpu",
                message=f"the plan (profile {jobspec.profile_name!r}) runs on GPUs but CUDA is "
                "not usable on this node (torch.cuda.is_available() is False: a CPU build of "
                "torch, no driver, or CUDA_VISIBLE_DEVICES empty)",
                fix="run in an image with CUDA-enabled torch on GPU nodes, or submit with a "
                "device: cpu profile",
            )  # fmt: skip
        )
    on_gpus = jobspec.device == "gpu"
    te_found: bool | None = None  # probed once, only when a setting needs it
    for need in jobspec.machine_needs:
        if need.needs == "transformer_engine":
            te_found = transformer_engine() if te_found is None else te_found
            met = te_found
        elif need.needs in _DEEP_EP_NAMES:
            met = deep_ep(_DEEP_EP_NAMES[need.needs])
        else:
            met = on_gpus
        if not met:
            problems.append(
                Problem(path=need.path, value=need.value, message=need.message, fix=need.fix)
            )
    return problems
