"""Log-prob passes of the Automodel backend: one micro-batch's token log-probs
(``forward_logprobs``), and the reference model built from the policy's weights in memory.

Why the in-memory reference: the reference is built at its first use, in GRPO's first step
before the first train step. Loading it from the checkpoint reads every weight from disk
again (~0.6 s of a warm run's first step on a tiny model, a full checkpoint read on a big
one) while the policy holds the very same tensors. When the policy still holds the weights
it loaded (no train step, no checkpoint loaded, no LoRA, no dequantized checkpoint), the
reference is built without weights (``unloaded_hf_model``: module init only, so
non-persistent buffers such as rotary ``inv_freq`` are the ones a normal build computes),
sharded exactly like the checkpoint-built reference, and each rank copies its local shards
of the policy's persistent state into it (``copy_policy_state``): copies, not aliases, since
the policy trains afterwards. Anything else loads from the checkpoint as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hpcrl.core.backends.automodel.context_parallel import context_parallel_logprobs
from hpcrl.core.backends.automodel.model import TokenLogprobModel, attention_implementation
from hpcrl.core.workers.micro_batches import unpack_logprobs

if TYPE_CHECKING:
    from hpcrl.core.policy import Batch
    from hpcrl.core.token_distribution import TokenDistribution


def forward_logprobs(
    model: TokenLogprobModel,
    micro: Batch,
    distribution: TokenDistribution | None = None,
    *,
    causal_only: bool = False,
    cp_group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) token log-probs [rows, width] of one micro-batch; a pack runs
    as one row whose positions restart per sequence, then is unpacked to the rows the loss
    expects. ``causal_only``: no attention mask (right-padded rows, the worker's docstring).
    ``cp_group``: the context-parallel group; this rank runs its share of every row."""
    if "packed_input_ids" not in micro:
        mask = None if causal_only else micro["attention_mask"]
        if cp_group is not None:
            return context_parallel_logprobs(
                model, micro["input_ids"], mask, cp_group, distribution
            )
        return model(micro["input_ids"], mask, distribution=distribution)
    processed, unfiltered = model(
        micro["packed_input_ids"],
        None,
        position_ids=micro["packed_position_ids"],
        distribution=distribution,
    )
    return unpack_logprobs(processed, micro), unpack_logprobs(unfiltered, micro)


def _no_init_weights() -> Any:
    try:  # transformers 5
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def unloaded_hf_model(model_path: str, device: str, hf_config_overrides: Any = None) -> nn.Module:
    """``load_hf_model``'s model without reading a weight: built from the same config on
    the host (fp32, same attention, vision frozen, experts unfused), parameters left
    uninitialised, buffers as module init computes them, then moved like a loaded one."""
    from hpcrl.core.backends.automodel.expert_layout import unfuse_experts
    from hpcrl.core.backends.automodel.multimodal import auto_model_class, freeze_vision
    from hpcrl.core.models.hf_config import load_hf_config

    config = load_hf_config(model_path, hf_config_overrides or {})
    model_class = auto_model_class(config)
    with _no_init_weights():
        model = model_class.from_config(
            config, dtype=torch.float32,
            attn_implementation=attention_implementation(model_class, config),
        )  # fmt: skip
    model.tie_weights()  # from_pretrained ties; from_config under no_init_weights does not
    model.eval()  # as from_pretrained returns it
    freeze_vision(model)
    model.config.use_cache = False
    unfuse_experts(model)
    if device == "cuda":
        parameters_on(model, torch.device("cuda"))
        model = model.to("cuda")  # the buffers, as load_hf_model moves them
    return model


def parameters_on(model: nn.Module, device: torch.device) -> None:
    """Every parameter replaced by an uninitialised one on ``device``, ties and requires_grad
    kept, buffers left as they are. For the GPU: the host tensors were never written, and
    ``.to("cuda")`` would read all of their pages (zero-fill faults and a host-to-device copy
    of the model's size) for values the copy overwrites."""
    moved: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in moved:
                empty = torch.empty_like(param, device=device)
                moved[id(param)] = nn.Parameter(empty, requires_grad=param.requires_grad)
            module._parameters[name] = moved[id(param)]


def _clean(name: str) -> str:
    """A root state-dict key without wrapper prefixes (compile, activation checkpointing):
    the policy is wrapped for training, the reference is not."""
    return name.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _layout(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What two tensors must share for their local parts to hold the same values: the
    placements, unless the local part is the whole tensor (one rank: the plain policy
    beside an FSDP-wrapped host-resident reference)."""
    from torch.distributed.tensor import DTensor

    whole = tuple(_local(tensor).shape) == tuple(tensor.shape)
    placements = tuple(tensor.placements) if isinstance(tensor, DTensor) and not whole else None
    # floating dtypes may differ: the host-resident reference keeps the compute dtype
    kind = "floating" if tensor.dtype.is_floating_point else tensor.dtype
    return placements, tuple(tensor.shape), tuple(_local(tensor).shape), kind


def resharded(module: nn.Module) -> None:
    """FSDP modules back to their sharded parameters (a root may stay unsharded after a
    forward): the local shards are what both models hold in the same layout."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()


@torch.no_grad()
def copy_policy_state(reference: nn.Module, policy: nn.Module) -> bool:
    """Copy each rank's local shards of ``policy``'s persistent state (parameters and
    persistent buffers) into ``reference``'s. False, nothing copied, where the two do not
    hold the same names in the same layout (sharding, shapes, kinds of dtype): the caller
    then loads the checkpoint. A floating tensor is rounded into the reference's dtype."""
    resharded(policy)
    resharded(reference)
    source = {_clean(name): t for name, t in policy.state_dict(keep_vars=True).items()}
    target = {_clean(name): t for name, t in reference.state_dict(keep_vars=True).items()}
    if source.keys() != target.keys():
        return False
    if any(_layout(source[name]) != _layout(target[name]) for name in target):
        return False
    for name, tensor in target.items():
        _local(tensor).copy_(_local(source[name]))
    return True
