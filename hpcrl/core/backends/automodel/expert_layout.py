"""MoE experts in the checkpoint's per-expert layout, whatever transformers version loads them.

transformers 5 (NeMo RL's containers ship 5.x) keeps the experts of an MoE block as one
module with 3-D weights (``experts.gate_up_proj`` [E, 2·I, H], ``experts.down_proj``
[E, H, I]), converted from the per-expert tensors of the checkpoint on load; transformers 4
keeps a list of per-expert MLPs named as the checkpoint names them. hpcrl trains the
per-expert layout under both:

- expert parallelism (``expert_parallel.py``) keeps and shards whole experts per rank;
- the state dict, and with it hpcrl's checkpoints, refits and exports, has the checkpoint's
  own names (``mlp.experts.<i>.gate_proj.weight``), so a checkpoint written under one
  transformers version resumes under the other and vLLM receives what it loads from disk.

``unfuse_experts`` (Qwen3-MoE, Mixtral, DeepSeek-V3, Nemotron-H, GLM-4.7-Flash) swaps each fused experts module for
``PerExpertMLPs``, which takes the same call and runs the same loop over the experts some
token is routed to.

``checkpoint_named_tensors`` covers fused experts of the other MoE families (FSDP-only
decoders): it maps state-dict names back to the checkpoint's with transformers' own reverse
conversion (what ``save_pretrained`` writes), so refits reach vLLM in checkpoint names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

#: transformers 5 fused experts class → the checkpoint's (gate, up, down) projection names;
#: gate None: a plain MLP ``down(act(up(x)))`` whose ``up_proj`` is not fused with a gate
FUSED_EXPERT_NAMES: dict[str, tuple[str | None, str, str]] = {
    "Qwen3MoeExperts": ("gate_proj", "up_proj", "down_proj"),
    "MixtralExperts": ("w1", "w3", "w2"),
    "DeepseekV3Experts": ("gate_proj", "up_proj", "down_proj"),
    "NemotronHExperts": (None, "up_proj", "down_proj"),
    "Glm4MoeLiteExperts": ("gate_proj", "up_proj", "down_proj"),
}


class ExpertMLP(nn.Module):
    """One expert with the checkpoint's projection names: ``down(act(gate(x)) * up(x))``, or
    ``down(act(up(x)))`` for an expert without a gate (Nemotron-H)."""

    def __init__(
        self,
        weights: Sequence[torch.Tensor],
        act_fn: Any,
        names: tuple[str | None, str, str],
    ) -> None:
        super().__init__()
        self.projection_names = names
        for name, weight in zip(self.projection_names, weights, strict=True):
            if name is None:
                continue
            linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
            linear.weight = nn.Parameter(weight.detach().clone(), requires_grad=True)
            setattr(self, name, linear)
        self.act_fn = act_fn

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate_name, up_name, down_name = self.projection_names
        up, down = getattr(self, up_name), getattr(self, down_name)
        if gate_name is None:
            return down(self.act_fn(up(hidden)))
        return down(self.act_fn(getattr(self, gate_name)(hidden)) * up(hidden))


def _expert_weights(experts: Any, index: int, gated: bool) -> tuple[Any, ...]:
    """(gate, up, down) weights of expert ``index`` of a fused experts module (gate None
    when the experts have none)."""
    down = experts.down_proj[index]
    if not gated:
        return None, experts.up_proj[index], down
    gate_up = experts.gate_up_proj[index]
    intermediate = down.shape[1]
    return gate_up[:intermediate], gate_up[intermediate:], down


class PerExpertMLPs(nn.ModuleList):
    """A fused experts module's drop-in: ``(hidden [T, H], top_k_index [T, k], top_k_weights
    [T, k]) → [T, H]``, each expert run on the tokens routed to it, weighted, summed."""

    def forward(
        self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        with torch.no_grad():
            hits = nn.functional.one_hot(top_k_index, num_classes=len(self) + 1)
            hits = hits.permute(2, 1, 0)  # [E + 1, k, T]
            routed = (hits.sum(dim=(-1, -2)) > 0).nonzero()[:, 0].tolist()
        for index in routed:
            if index == len(self):
                continue
            slot, token = torch.where(hits[index])
            expert_out = self[index](hidden[token]) * top_k_weights[token, slot, None]
            out.index_add_(0, token, expert_out.to(out.dtype))
        return out


def unfuse_experts(hf_model: Any) -> int:
    """Replace every fused experts module (``FUSED_EXPERT_NAMES``) by ``PerExpertMLPs`` with
    the same weights; the number replaced (0 under transformers 4 or a dense model)."""
    replaced = 0
    for module in list(hf_model.modules()):
        experts: Any = getattr(module, "experts", None)
        names = FUSED_EXPERT_NAMES.get(type(experts).__name__)
        if experts is None or names is None:
            continue
        gated = names[0] is not None
        module.experts = PerExpertMLPs(
            ExpertMLP(_expert_weights(experts, e, gated), experts.act_fn, names)
            for e in range(experts.down_proj.shape[0])
        )
        replaced += 1
    return replaced


def checkpoint_named_tensors(
    hf_model: Any, named: list[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """``named`` (state-dict names of ``hf_model``) in the checkpoint's names and layout:
    transformers 5's reverse weight conversion where the model has one, else unchanged."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: the state dict is the checkpoint's layout
        return named
    reverted = revert_weight_conversion(hf_model, dict(named))
    return list(reverted.items())
