"""The recipe schema's LoRA section (``policy.automodel_cfg.lora_cfg``, NeMo RL's
``policy.dtensor_cfg.lora_cfg``). Part of ``hpcrl.config.recipe`` (which re-exports it);
cross-field rules in ``hpcrl.config.lora_rules``, the adapters in
``hpcrl.core.backends.automodel.lora``.
"""

from __future__ import annotations

from typing import Literal

import attrs

from hpcrl.config.field_bounds import FieldBound, bounded
from hpcrl.config.shared_methods import SharedMethods


@attrs.frozen(kw_only=True)
class LoraCfg(SharedMethods):
    """Low-rank adapters on the policy's linear layers, NeMo RL's (NeMo Automodel's) meaning:
    ``y = W x + b + (alpha / dim) * B(A(x))``, W and b frozen, only A and B trained.

    Which linears: ``match_all_linear`` every ``nn.Linear`` (an output layer tied to the input
    embedding excepted); else ``target_modules`` (names or wildcard patterns of the Hugging
    Face module names, ``*`` matching any run of characters); else every linear except those
    ``exclude_modules`` names.
    """

    enabled: bool = False
    target_modules: tuple[str, ...] = ()
    exclude_modules: tuple[str, ...] = ()
    match_all_linear: bool = True
    # the rank r: A is [dim, in_features], B is [out_features, dim]. Checked while this
    # section and policy.automodel_cfg are enabled (``when``: every enclosing switch)
    dim: int = bounded(
        8,
        FieldBound(low=1, message="the LoRA rank must be at least 1",
                   fix="set {path} to a positive rank (8, 16, 32, ...)"),
        when="enabled",
    )  # fmt: skip
    alpha: float = 32.0  # the adapter's output is scaled by alpha / dim
    dropout: float = bounded(
        0.0,
        FieldBound(low=0.0, high=1.0, high_open=True,
                   message="a dropout probability must lie in [0, 1)",
                   fix="set {path} between 0.0 (off) and 1.0"),
        when="enabled",
    )  # fmt: skip
    dropout_position: Literal["pre", "post"] = "post"  # on A's input, or on the scaled output
    lora_A_init: Literal["xavier", "uniform"] = "xavier"  # B always starts at zero
    # NeMo Automodel's Triton kernel for the same product; hpcrl computes it with PyTorch
    use_triton: bool = True

    @property
    def scale(self) -> float:
        return self.alpha / self.dim
