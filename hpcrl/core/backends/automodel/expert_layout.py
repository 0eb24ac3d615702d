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

``unfuse_experts`` (Qwen3-MoE, Mixtral, DeepSeek-V3, Nemotron-H, GLM-4.7-Flash, Qwen3.5 MoE) swaps each fused experts module for
``PerExpertMLPs``, which takes the same call and runs the same loop over the experts some
token is routed to.

``checkpoint_named_tensors`` covers fused experts of the other MoE families (FSDP-only
decoders): it maps state-dict names back to the checkpoint's with transformers' own reverse
conversion (what ``save_pretrained`` writes), so refits reach vLLM in checkpoint names.

Gemma 4's checkpoints keep the experts fused themselves (``experts.gate_up_proj``, which
vLLM loads): they train per expert too (expert parallelism keeps whole experts), and
``fuse_expert_tensors`` stacks them back wherever weights leave in the checkpoint's names
(refit, ``hpcrl export``, ``save_consolidated``; ``FUSED_ON_DISK``).

gpt-oss keeps its experts fused under both transformers versions and on disk
(``experts.gate_up_proj`` [E, H, 2·I] with gate and up columns interleaved, biases, a clamped
SwiGLU): ``GptOssExpert`` holds one expert's slices under the same parameter names
(``experts.<i>.gate_up_proj`` [H, 2·I], …), which ``fuse_expert_tensors`` stacks back.
"""

from __future__ import annotations

import re
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
    "Gemma4TextExperts": ("gate_proj", "up_proj", "down_proj"),
    "Qwen3_5MoeExperts": ("gate_proj", "up_proj", "down_proj"),
    # gate and up interleaved in one tensor, with biases: split by ``GptOssExpert``
    "GptOssExperts": ("gate_up_proj", "gate_up_proj", "down_proj"),
}
#: fused experts classes whose checkpoints hold the fused 3-D weights as well
#: (``gate_up_proj`` [E, 2·I, H]: gate rows first, ``down_proj`` [E, H, I])
FUSED_ON_DISK = frozenset({"Gemma4TextExperts", "GptOssExperts"})
_PER_EXPERT = re.compile(r"(?P<index>\d+)\.(?P<projection>gate_proj|up_proj|down_proj)\.weight")
#: gpt-oss's fused parameters, each [E, ...]: one expert's slice keeps the name
GPT_OSS_EXPERT_PARAMS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
_STACKED_EXPERT = re.compile(r"(?P<index>\d+)\.(?P<name>" + "|".join(GPT_OSS_EXPERT_PARAMS) + ")")


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


class GptOssExpert(nn.Module):
    """One gpt-oss expert, transformers' ``GptOssExperts`` math for one expert index:
    ``x @ gate_up_proj + bias`` split into interleaved gate (even) and up (odd) columns,
    gate clamped above and up on both sides at ``limit``, ``(up + 1) · gate · σ(α·gate)``,
    then ``@ down_proj + bias``."""

    def __init__(self, experts: Any, index: int) -> None:
        super().__init__()
        for name in GPT_OSS_EXPERT_PARAMS:
            weight = getattr(experts, name)[index].detach().clone()
            setattr(self, name, nn.Parameter(weight, requires_grad=True))
        self.alpha, self.limit = float(experts.alpha), float(experts.limit)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate_up = hidden @ self.gate_up_proj + self.gate_up_proj_bias
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return ((up + 1) * glu) @ self.down_proj + self.down_proj_bias


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
    [T, k]) → [T, H]``, each expert run on the tokens routed to it, weighted, summed.
    ``fused_on_disk``: the checkpoint keeps these experts fused (``FUSED_ON_DISK``)."""

    fused_on_disk = False

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


class GptOssPerExpertMLPs(PerExpertMLPs):
    """``GptOssExperts``' call: transformers 4 passes tokens [B, S, H] or [T, H] and dense
    routing weights [T, E], transformers 5 tokens [T, H] and top-k weights [T, k]."""

    fused_on_disk = True

    def forward(  # transformers' keyword names: transformers 4 passes them by name
        self, hidden: torch.Tensor, router_indices: torch.Tensor, routing_weights: torch.Tensor
    ) -> torch.Tensor:
        if routing_weights.shape[-1] != router_indices.shape[-1]:  # dense [T, E]: the top-k
            routing_weights = routing_weights.gather(-1, router_indices)
        flat = hidden.reshape(-1, hidden.shape[-1])
        return super().forward(flat, router_indices, routing_weights).reshape(hidden.shape)


def _per_expert(experts: Any, kind: str, names: tuple[str | None, str, str]) -> PerExpertMLPs:
    if kind == "GptOssExperts":
        return GptOssPerExpertMLPs(
            GptOssExpert(experts, e) for e in range(experts.down_proj.shape[0])
        )
    gated = names[0] is not None
    unfused = PerExpertMLPs(
        ExpertMLP(_expert_weights(experts, e, gated), experts.act_fn, names)
        for e in range(experts.down_proj.shape[0])
    )
    unfused.fused_on_disk = kind in FUSED_ON_DISK
    return unfused


def unfuse_experts(hf_model: Any, keep_fused_on_disk: bool = False) -> int:
    """Replace every fused experts module (``FUSED_EXPERT_NAMES``) by ``PerExpertMLPs`` with
    the same weights; the number replaced (0 under transformers 4 or a dense model).
    ``keep_fused_on_disk``: leave those of ``FUSED_ON_DISK`` fused (a model about to be saved
    in the checkpoint's layout, its weights through ``fuse_expert_tensors``)."""
    replaced = 0
    for module in list(hf_model.modules()):
        experts: Any = getattr(module, "experts", None)
        kind = type(experts).__name__
        names = FUSED_EXPERT_NAMES.get(kind)
        if experts is None or names is None or (keep_fused_on_disk and kind in FUSED_ON_DISK):
            continue
        module.experts = _per_expert(experts, kind, names)
        replaced += 1
    return replaced


def fuse_expert_tensors(
    hf_model: Any, named: list[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """``named`` with the per-expert weights of experts their checkpoint keeps fused
    (``FUSED_ON_DISK``, fused or unfused in ``hf_model``) stacked into the checkpoint's
    ``experts.gate_up_proj`` and ``experts.down_proj``; other tensors unchanged."""
    prefixes = set()
    for name, module in hf_model.named_modules():
        experts = getattr(module, "experts", None)
        if getattr(experts, "fused_on_disk", False) or type(experts).__name__ in FUSED_ON_DISK:
            prefixes.add(f"{name}.experts." if name else "experts.")
    if not prefixes:
        return named
    kept: list[tuple[str, torch.Tensor]] = []
    parts: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    stacked: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in named:
        prefix, _, rest = name.rpartition(".experts.")
        fused_here = f"{prefix}.experts." in prefixes
        found = _PER_EXPERT.fullmatch(rest) if fused_here else None
        slice_of = _STACKED_EXPERT.fullmatch(rest) if fused_here else None
        if slice_of is not None:  # gpt-oss: the fused tensor is the experts' slices stacked
            stacked.setdefault(f"{prefix}.experts.{slice_of['name']}", {})[
                int(slice_of["index"])
            ] = tensor
        elif found is None:
            kept.append((name, tensor))
        else:
            key = (int(found["index"]), found["projection"])
            parts.setdefault(f"{prefix}.experts.", {})[key] = tensor
    for fused_name, slices in stacked.items():
        kept.append((fused_name, torch.stack([slices[e] for e in range(len(slices))])))
    for prefix, weights in parts.items():
        count = 1 + max(index for index, _ in weights)
        gate_up = [
            torch.cat([weights[e, "gate_proj"], weights[e, "up_proj"]]) for e in range(count)
        ]
        kept.append((f"{prefix}gate_up_proj", torch.stack(gate_up)))
        kept.append(
            (f"{prefix}down_proj", torch.stack([weights[e, "down_proj"] for e in range(count)]))
        )
    return kept


def checkpoint_named_tensors(
    hf_model: Any, named: list[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """``named`` (state-dict names of ``hf_model``) in the checkpoint's names and layout:
    experts fused where the checkpoint fuses them (``fuse_expert_tensors``), transformers 5's
    reverse weight conversion where the model has one, else unchanged."""
    named = fuse_expert_tensors(hf_model, named)
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: the state dict is the checkpoint's layout
        return named
    reverted = revert_weight_conversion(hf_model, dict(named))
    return list(reverted.items())
