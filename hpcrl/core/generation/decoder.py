"""The decoder the torch engine runs: Llama / Qwen2 / Qwen3 / Mistral-style weights held in
fused tensors the engine owns, a static KV cache, and two forwards.

- ``prefill``: prompt tokens packed into one ``[tokens, hidden]`` matrix, so projections
  and MLPs do no work for padding; only attention sees the padded ``[rows, columns]``
  layout, which is also the KV cache's.
- ``decode_step``: one token for each of the first ``b`` cache rows, attending to the first
  ``l`` cache columns; every shape is fixed by ``(b, l)`` and every index lives on the
  device, so the step can be captured once as a CUDA graph and replayed.

Rows are left-aligned on a shared column: a row's prompt ends at column ``P`` (the longest
prompt of the batch) and its ``t``-th generated token is written at column ``P + t``.
Numerics follow Hugging Face's modules (RMSNorm in float32, rotary tables from the model's
own rotary class, softmax in float32), so greedy output equals ``generate``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

# None of these post-processes lm_head's output in its HF forward (no soft-cap or logit
# scale: ``token_distribution.LogitTransform`` is the identity), so the decoder's logits are
# the ones the log-prob contract starts from.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# Buffers some exports carry that the engine recomputes itself.
IGNORED_WEIGHT_SUFFIXES = ("rotary_emb.inv_freq",)


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one the torch engine implements."""


@attrs.frozen(kw_only=True)
class DecoderShape:
    """Sizes and variant flags read from a Hugging Face config."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    tied_embeddings: bool
    sliding_window: int | None

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @classmethod
    def from_hf_config(cls, config: Any) -> DecoderShape:
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"hpcrl's torch sampler implements {', '.join(SUPPORTED_MODEL_TYPES)} decoders, "
                f"not model_type {model_type!r}; set policy.generation.backend=vllm"
            )
        if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
            raise UnsupportedModelError(
                f"{model_type} with hidden_act={config.hidden_act!r} / mlp_bias: the torch "
                "sampler implements SiLU MLPs without bias; set policy.generation.backend=vllm"
            )
        heads = config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            num_layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
            rms_eps=config.rms_norm_eps,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            qk_norm=model_type == "qwen3",
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            sliding_window=_sliding_window(config),
        )


def _sliding_window(config: Any) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


class LayerWeights:
    """One decoder block's weights; q/k/v and gate/up are fused into single matrices."""

    def __init__(self, shape: DecoderShape, **factory: Any) -> None:
        import torch

        hidden, width = shape.hidden, shape.qkv_width
        self.input_norm = torch.empty(hidden, **factory)
        self.qkv = torch.empty(width, hidden, **factory)
        self.qkv_bias = torch.empty(width, **factory) if shape.qkv_bias else None
        self.o = torch.empty(hidden, shape.num_heads * shape.head_dim, **factory)
        self.o_bias = torch.empty(hidden, **factory) if shape.o_bias else None
        self.q_norm = torch.empty(shape.head_dim, **factory) if shape.qk_norm else None
        self.k_norm = torch.empty(shape.head_dim, **factory) if shape.qk_norm else None
        self.post_norm = torch.empty(hidden, **factory)
        self.gate_up = torch.empty(2 * shape.intermediate, hidden, **factory)
        self.down = torch.empty(hidden, shape.intermediate, **factory)

    def views_by_hf_name(self, shape: DecoderShape, prefix: str) -> dict[str, torch.Tensor]:
        q_end = shape.num_heads * shape.head_dim
        k_end = q_end + shape.num_kv_heads * shape.head_dim
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        views = {
            prefix + "input_layernorm.weight": self.input_norm,
            prefix + "post_attention_layernorm.weight": self.post_norm,
            attn + "q_proj.weight": self.qkv[:q_end],
            attn + "k_proj.weight": self.qkv[q_end:k_end],
            attn + "v_proj.weight": self.qkv[k_end:],
            attn + "o_proj.weight": self.o,
            mlp + "gate_proj.weight": self.gate_up[: shape.intermediate],
            mlp + "up_proj.weight": self.gate_up[shape.intermediate :],
            mlp + "down_proj.weight": self.down,
        }
        if self.qkv_bias is not None:
            views[attn + "q_proj.bias"] = self.qkv_bias[:q_end]
            views[attn + "k_proj.bias"] = self.qkv_bias[q_end:k_end]
            views[attn + "v_proj.bias"] = self.qkv_bias[k_end:]
        if self.o_bias is not None:
            views[attn + "o_proj.bias"] = self.o_bias
        if self.q_norm is not None and self.k_norm is not None:
            views[attn + "q_norm.weight"] = self.q_norm
            views[attn + "k_norm.weight"] = self.k_norm
        return views


# ---------------------------------------------------------------------- pointwise pieces
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's RMSNorm: statistics in float32, scale applied in the input dtype."""
    import torch

    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(
    residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + delta, rms_norm(residual + delta))``: one fusable piece."""
    summed = residual + delta
    return summed, rms_norm(summed, weight, eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [..., heads, D]`` with ``cos``/``sin [..., 1, D]``."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def rotate_pair(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotate`` of queries and keys: one piece, so that fused it is one kernel, not two."""
    return rotate(q, cos, sin), rotate(k, cos, sin)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    half = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :half]) * gate_up[..., half:]


def masked_softmax(scores: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention probabilities from raw decode scores ``[b·Hkv, group, l]``, in the scores'
    dtype: scaled in that dtype, then ``bias [b, 1, 1, l]`` (0 or a large negative number)
    and softmax in float32, as Hugging Face's eager attention computes them. Eager this is
    four kernels per layer, fused one. (The scores come in as the matmul's own output, not a
    view of it: compiled, a view would be guarded on its base's sizes, and a base size that
    happens to equal ``l`` would recompile.)"""
    import torch

    rows, group, columns = bias.shape[0], scores.shape[1], scores.shape[2]
    per_row = scores.view(rows, scores.shape[0] // rows, group, columns)
    scaled = (per_row * scale).float() + bias
    return torch.softmax(scaled, dim=-1).to(scores.dtype).view(scores.shape)


@attrs.define
class Pointwise:
    """The elementwise pieces of a block; ``fused`` swaps in torch.compile'd versions."""

    rms_norm: Callable[..., Any] = rms_norm
    add_rms_norm: Callable[..., Any] = add_rms_norm
    rotate_pair: Callable[..., Any] = rotate_pair
    silu_mul: Callable[..., Any] = silu_mul
    masked_softmax: Callable[..., Any] = masked_softmax

    @classmethod
    def fused(cls, backend: Any = "inductor") -> Pointwise:
        """One kernel per piece (GPU), each compiled once for every shape
        (``compiled.compiled_piece``: prefill and every decode batch size share one
        compilation). A piece that fails to compile runs eagerly instead; no piece is first
        called inside a graph capture (the norms, rotary and MLP pieces first run in the
        eager prefill, ``masked_softmax`` in the eager warm-up steps that precede every
        capture). ``backend``: torch.compile's. A piece never called is never compiled:
        ``rms_norm`` serves only the q/k norms (Qwen3)."""
        from hpcrl.core.generation.compiled import compiled_piece as compiled

        return cls(
            rms_norm=compiled(rms_norm, backend=backend),
            add_rms_norm=compiled(add_rms_norm, backend=backend),
            rotate_pair=compiled(rotate_pair, backend=backend),
            silu_mul=compiled(silu_mul, backend=backend),
            masked_softmax=compiled(masked_softmax, backend=backend),
        )


# ---------------------------------------------------------------------- the model
class Decoder:
    """Weights, rotary tables and the two forwards. Construct, then ``load`` weights."""

    def __init__(self, config: Any, device: torch.device, dtype: torch.dtype) -> None:
        import torch

        self.config = config
        self.shape = shape = DecoderShape.from_hf_config(config)
        self.device, self.dtype = device, dtype
        factory = {"device": device, "dtype": dtype}
        self.embed = torch.empty(shape.vocab, shape.hidden, **factory)
        self.lm_head = self.embed if shape.tied_embeddings else torch.empty_like(self.embed)
        self.final_norm = torch.empty(shape.hidden, **factory)
        self.layers = [LayerWeights(shape, **factory) for _ in range(shape.num_layers)]
        self.pointwise = Pointwise()
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None

    # ------------------------------------------------------------------ weights
    def views_by_hf_name(self) -> dict[str, torch.Tensor]:
        views = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.final_norm}
        if not self.shape.tied_embeddings:
            views["lm_head.weight"] = self.lm_head
        for index, layer in enumerate(self.layers):
            views.update(layer.views_by_hf_name(self.shape, f"model.layers.{index}."))
        return views

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named weights in place (CUDA graphs keep pointing at the same memory)."""
        import torch

        views = self.views_by_hf_name()
        written: set[str] = set()
        unknown: list[str] = []
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name.endswith(IGNORED_WEIGHT_SUFFIXES):
                    continue
                if name == "lm_head.weight" and self.shape.tied_embeddings:
                    continue
                target = views.get(name)
                if target is None:
                    unknown.append(name)
                    continue
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"weight {name}: shape {tuple(tensor.shape)}, the engine expects "
                        f"{tuple(target.shape)} (config and weights disagree)"
                    )
                target.copy_(tensor)
                written.add(name)
        missing = sorted(set(views) - written)
        if unknown or missing:
            raise ValueError(
                f"weights do not match the {self.config.model_type} decoder: unknown "
                f"{unknown[:5]}{'…' if len(unknown) > 5 else ''}, missing "
                f"{missing[:5]}{'…' if len(missing) > 5 else ''}"
            )

    def ensure_rotary_tables(self, num_positions: int) -> None:
        """cos/sin for positions ``0 .. num_positions-1`` from the model's own rotary class."""
        if self.cos is not None and self.cos.shape[0] >= num_positions:
            return
        import torch

        rotary = build_rotary_embedding(self.config)
        if rotary.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {rotary.rope_type!r}: the torch sampler precomputes position tables "
                f"and supports {', '.join(SUPPORTED_ROPE_TYPES)}; set policy.generation.backend=vllm"
            )
        positions = torch.arange(num_positions)[None]
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
        self.cos = cos[0].to(self.device, self.dtype)
        self.sin = sin[0].to(self.device, self.dtype)

    # ------------------------------------------------------------------ forwards
    def _qkv(
        self,
        layer: LayerWeights,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [n, H, D], k and v [n, Hkv, D] of ``x [n, hidden]``, rotary applied unless
        ``cos``/``sin`` are None (the attention then rotates: ``triton_attention``)."""
        import torch.nn.functional as F

        shape, pw = self.shape, self.pointwise
        qkv = F.linear(x, layer.qkv, layer.qkv_bias)
        heads = qkv.view(x.shape[0], shape.num_heads + 2 * shape.num_kv_heads, shape.head_dim)
        q = heads[:, : shape.num_heads]
        k = heads[:, shape.num_heads : shape.num_heads + shape.num_kv_heads]
        v = heads[:, shape.num_heads + shape.num_kv_heads :]
        if layer.q_norm is not None:
            q = pw.rms_norm(q, layer.q_norm, shape.rms_eps)
            k = pw.rms_norm(k, layer.k_norm, shape.rms_eps)
        if cos is not None and sin is not None:
            q, k = pw.rotate_pair(q, k, cos, sin)
        return q, k, v

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.linear(self.pointwise.silu_mul(F.linear(x, layer.gate_up)), layer.down)

    def _block(
        self,
        layer: LayerWeights,
        hidden: torch.Tensor,
        normed: torch.Tensor,
        attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block on ``[n, hidden]`` rows; ``attend(q, k, v)`` stores k/v and returns the
        attention output ``[n, H*D]``. Returns (residual stream, its next-norm input)."""
        import torch.nn.functional as F

        shape, pw = self.shape, self.pointwise
        q, k, v = self._qkv(layer, normed, cos, sin)
        attn = F.linear(attend(q, k, v), layer.o, layer.o_bias)
        hidden, normed = pw.add_rms_norm(hidden, attn, layer.post_norm, shape.rms_eps)
        return hidden, self._mlp(layer, normed)

    def forward_rows(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """All blocks over ``[n, hidden]`` rows; returns the final-normed hidden states.
        ``cos``/``sin`` None: ``attend`` gets q and k unrotated and rotates them itself."""
        import torch

        shape, pw = self.shape, self.pointwise
        # The first norm through the blocks' own ``add_rms_norm`` (adding exact zeros): one
        # compiled piece fewer to trace and load in a run's first step (docs/performance.md,
        # item 3), and ``rms_norm`` is left to the q/k norms of the models that have them.
        _, normed = pw.add_rms_norm(
            hidden, torch.zeros_like(hidden), self.layers[0].input_norm, shape.rms_eps
        )
        for index, layer in enumerate(self.layers):

            def attend_here(
                q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: int = index
            ) -> torch.Tensor:
                return attend(index, q, k, v)

            hidden, mlp_out = self._block(layer, hidden, normed, attend_here, cos, sin)
            next_norm = self.layers[index + 1].input_norm if index + 1 < len(self.layers) else None
            weight = next_norm if next_norm is not None else self.final_norm
            hidden, normed = pw.add_rms_norm(hidden, mlp_out, weight, shape.rms_eps)
        return normed

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.linear(normed, self.lm_head).float()

    def logits_into(self, normed: torch.Tensor, out: torch.Tensor) -> None:
        """``out.copy_(logits(normed))`` without the float32 temporary (the copy casts)."""
        import torch.nn.functional as F

        out.copy_(F.linear(normed, self.lm_head))


def build_rotary_embedding(config: Any) -> Any:
    """The model's own rotary module (its class found on a meta-device instance), on CPU.
    Built from ``config`` alone: transformers 4 also takes a device, 5 does not."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(config)
    rotary_class = type(meta_model.get_decoder().rotary_emb)
    with torch.device("cpu"):
        return rotary_class(config=config)
