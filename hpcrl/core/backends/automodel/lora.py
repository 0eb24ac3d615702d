"""LoRA adapters for the Automodel backend: ``apply_lora`` changes a Hugging Face model in
place, like the ``apply_*`` parallelism steps (it runs before them: FSDP then shards each
block's adapters with the block), and knows nothing about training.

An adapted linear keeps its weight and bias under the same names (``...q_proj.weight``), so
checkpoints of the base model still load into it, and gains ``lora_A``/``lora_B``
(``...q_proj.lora_A.weight``). Every other parameter of the model is frozen. The weights the
generation engine and a Hugging Face export get are merged: ``W + (alpha / dim) * B @ A``
(``merge_adapters``), with no adapter names left.

Semantics follow NeMo RL's (NeMo Automodel's ``LinearLoRA`` and module matcher, which NeMo
RL's DTensor worker uses): the same selection rules and wildcards, dropout before A or after
the scaled product, B initialised to zero, A by ``lora_A_init``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from hpcrl.config.recipe import LoraCfg

ADAPTER_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
LORA_PATH = "policy.automodel_cfg.lora_cfg"


class LoraLinear(nn.Module):
    """``base(x) + scale * B(A(x))`` with the base linear's parameters, frozen, under its own
    names; dropout on A's input (``pre``) or on the scaled product (``post``)."""

    def __init__(self, base: nn.Linear, cfg: LoraCfg) -> None:
        super().__init__()
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, cfg.dim, bias=False, **factory)
        self.lora_B = nn.Linear(cfg.dim, base.out_features, bias=False, **factory)
        self.scale = cfg.scale
        self.dropout_p = cfg.dropout
        self.dropout_position = cfg.dropout_position
        init_adapter(self.lora_A.weight, self.lora_B.weight, cfg.lora_A_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.dropout_position == "pre":
            x = F.dropout(x, p=self.dropout_p, training=self.training)
        delta = self.lora_B(self.lora_A(x)) * self.scale
        if self.dropout_position == "post":
            delta = F.dropout(delta, p=self.dropout_p, training=self.training)
        return out + delta

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, scale={self.scale}"


@torch.no_grad()
def init_adapter(lora_a: torch.Tensor, lora_b: torch.Tensor, lora_a_init: str) -> None:
    """B = 0, so an adapted model starts equal to its base. A as NeMo Automodel initialises
    it: ``xavier`` draws from U(0, 1) (its code does exactly that under this name), any
    other name is PyTorch's default Linear init (Kaiming uniform, a = sqrt(5))."""
    if lora_a_init == "xavier":
        nn.init.uniform_(lora_a)
    else:
        nn.init.kaiming_uniform_(lora_a, a=math.sqrt(5))
    lora_b.zero_()


def wildcard_regex(pattern: str) -> re.Pattern[str]:
    """NeMo Automodel's wildcard: ``*`` matches any characters (dots too), the whole name
    must match; the rest of the pattern is a regular expression."""
    return re.compile("^" + re.sub(r"\*", ".*", pattern.replace(".*", "*")) + "$")


def _matches(patterns: Iterable[str], name: str) -> bool:
    return any(name == pattern or wildcard_regex(pattern).match(name) for pattern in patterns)


def _tied_to_input(hf_model: nn.Module, module: nn.Module) -> bool:
    embeddings = hf_model.get_input_embeddings()
    return embeddings is not None and getattr(module, "weight", None) is embeddings.weight


def selected_linears(hf_model: nn.Module, cfg: LoraCfg) -> list[str]:
    """Names of the linears ``cfg`` adapts, in module order: every linear with
    ``match_all_linear``, else those ``target_modules`` match, else all but those
    ``exclude_modules`` match; never an output layer tied to the input embedding."""
    chosen = []
    for name, module in hf_model.named_modules():
        if not isinstance(module, nn.Linear) or _tied_to_input(hf_model, module):
            continue
        if cfg.match_all_linear:
            chosen.append(name)
        elif cfg.target_modules:
            if _matches(cfg.target_modules, name):
                chosen.append(name)
        elif not _matches(cfg.exclude_modules, name):
            chosen.append(name)
    return chosen


def apply_lora(hf_model: nn.Module, cfg: LoraCfg) -> list[str]:
    """Freeze ``hf_model`` and put an adapter on each selected linear; returns their names.
    Raises (the config's path, what the model has, the fix) when nothing is selected."""
    names = selected_linears(hf_model, cfg)
    if not names:
        linears = [n for n, m in hf_model.named_modules() if isinstance(m, nn.Linear)]
        raise ValueError(
            f"{LORA_PATH}: target_modules={list(cfg.target_modules)} / exclude_modules="
            f"{list(cfg.exclude_modules)} select no linear layer of {type(hf_model).__name__} "
            f"(its linears are named like {linears[:4]}); name some of them, or set "
            f"{LORA_PATH}.match_all_linear=true"
        )
    hf_model.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = hf_model.get_submodule(parent_name)
        setattr(parent, child, LoraLinear(getattr(parent, child), cfg))
    return names


def merge_adapters(
    named: Iterable[tuple[str, torch.Tensor]], scale: float
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs with each adapted weight replaced by ``W + scale * B @ A``
    (computed in fp32, returned in W's dtype) and the adapter tensors dropped; pairs without
    adapters come back unchanged, in their order."""
    pairs = list(named)
    tensors: Mapping[str, torch.Tensor] = dict(pairs)
    merged = []
    for name, tensor in pairs:
        if name.endswith(ADAPTER_SUFFIXES):
            continue
        module = name.removesuffix(".weight")
        lora_a = tensors.get(f"{module}.lora_A.weight")
        if name.endswith(".weight") and lora_a is not None:
            lora_b = tensors[f"{module}.lora_B.weight"]
            delta = lora_b.float() @ lora_a.to(lora_b.device).float()
            tensor = (tensor.float() + scale * delta.to(tensor.device)).to(tensor.dtype)
        merged.append((name, tensor))
    return merged


def adapter_names(named: Iterable[str]) -> list[str]:
    return [name for name in named if name.endswith(ADAPTER_SUFFIXES)]


def lora_summary(names: list[str], model: Any) -> str:
    """One line for the job log: how many linears got adapters, and the share trained."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return (
        f"[hpcrl lora] adapters on {len(names)} linear layers; {trained:,} of {total:,} "
        f"parameters trained ({100.0 * trained / max(total, 1):.2f}%)"
    )
