"""Expert parallelism (EP) for Hugging Face MoE decoders on the Automodel backend.

``policy.automodel_cfg.expert_parallel_size`` (NeMo RL's ``dtensor_cfg.expert_parallel_size``)
= ep splits the data-parallel ranks into EP groups of ep consecutive ranks; rank r of a group
keeps experts ``[r·E/ep, (r+1)·E/ep)`` of every MoE layer and drops the rest. The ranks that
keep the same experts (one per EP group, dp/ep of them: the "ep_shard" ranks) shard those
experts with FSDP2 among themselves; everything else (attention, norms, router, embeddings)
is sharded by FSDP2 over all dp ranks, as without EP.

Token exchange, written for gloo (which has no all-to-all), per MoE layer and pass:
1. every rank of the EP group all-gathers the group's tokens (padded to the longest rank);
2. every rank routes all of them (the router is the same on every rank) and runs its own
   experts on the tokens routed to them: a partial output for all the group's tokens;
3. an all-reduce sums the partial outputs and each rank keeps its own rows.
Backward mirrors it (the all-reduce's gradient is an all-gather, the all-gather's is an
all-reduce of which a rank keeps its rows). An expert no token of the whole batch is routed
to is skipped by all its holders (a small all-reduce of per-expert counts among them), as
one process skips it: no gradient, so AdamW leaves it untouched. Cost per layer, forward, with T tokens per rank
and hidden size H: all-gather ep·T·H and all-reduce ep·T·H elements, and every rank routes
ep·T tokens. An all-to-all (NCCL) moves only the routed k·T·H/ep·(ep−1) and is what
NeMo Automodel uses; this exchange is exact, not fast.

Gradients: the training loss of every rank is scaled by dp (FSDP2 averages over dp). An
expert's gradient already sums the whole EP group's tokens, and FSDP2 then averages it over
the dp/ep ranks that hold it: the expert's gradient comes out ep times too large, so each
owned expert scales its weight gradients by 1/ep (not the gradient it passes back to the
tokens). The gradient norm of the experts is the sum over the EP group (``grad_norm``).

Supported MoE blocks: the Hugging Face Qwen3-MoE, Mixtral, DeepSeek-V3, Nemotron-H,
GLM-4.7-Flash (transformers 5 only; DeepSeek-V3's block under another name), Qwen3.5 MoE
(transformers 5 only) and gpt-oss blocks (``MOE_BLOCKS``; gpt-oss's ``router`` and its
biased, clamped experts): a ``gate`` router (transformers 4's Qwen3-MoE and Mixtral: a linear layer,
softmax → top-k (→ renormalised) here; otherwise a module that routes itself) and a list of
experts (transformers 5's fused experts are split into one by
``expert_layout.unfuse_experts``); DeepSeek-V3's shared experts run on each rank's own
tokens, outside the exchange, and so does Qwen3.5's one shared expert with its sigmoid gate
(``GATED_SHARED_EXPERT``). Gemma 4's decoder layer routes itself and calls its experts
(``EXPERT_CALL_LAYERS``; a dense MLP beside them, the router reading other states than the
experts): there the experts' call is exchanged instead, the group's tokens gathered with
their routing (expert indices, and weights with their gradient).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hpcrl.core.backends.automodel.expert_layout import unfuse_experts
from hpcrl.core.backends.automodel.parallelize import decoder_layers

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

#: HF MoE block class → whether it renormalises the top-k weights (None: the config's
#: ``norm_topk_prob`` decides)
MOE_BLOCKS: dict[str, bool | None] = {
    "Qwen3MoeSparseMoeBlock": None,
    "MixtralSparseMoeBlock": True,
    "DeepseekV3MoE": None,  # its router module routes (sigmoid, grouped top-k, scaling)
    "NemotronHMoE": None,  # the same router; plain (ungated) experts, optional latent space
    "Glm4MoeLiteMoE": None,  # GLM-4.7-Flash: DeepSeek-V3's block (router, shared experts)
    "Qwen3_5MoeSparseMoeBlock": None,  # its router module routes; a gated shared expert
    "GptOssMLP": None,  # its ``router`` routes (top-k of biased logits → softmax)
}
#: a block's shared expert and the linear whose sigmoid scales its output per token (Qwen3.5)
GATED_SHARED_EXPERT = ("shared_expert", "shared_expert_gate")
#: blocks that return (hidden states, router scores) whatever they route with: the decoder
#: layer unpacks two values and drops the scores
PAIR_RETURNING_BLOCKS = ("GptOssMLP",)
#: decoder layers that route their tokens and call ``experts(tokens, indices, weights)``
#: themselves (Gemma 4's MoE layers): EP exchanges that call
EXPERT_CALL_LAYERS = ("Gemma4TextDecoderLayer",)
EP_MESH_DIM_NAMES = ("ep_shard", "ep")
#: a block's projections into and out of its experts' space (Nemotron-H's moe_latent_size;
#: identities without it), applied around the exchange
LATENT_PROJECTIONS = ("fc1_latent_proj", "fc2_latent_proj")
#: set on every parameter of an owned expert (after FSDP): the EP group its norm sums over
EXPERT_GROUP_ATTR = "hpcrl_expert_group"


@attrs.frozen
class ExpertLayout:
    """Which experts this rank keeps: ``ep_rank``-th slice of ``num_experts`` over ``ep``."""

    num_experts: int
    ep: int
    ep_rank: int

    @property
    def per_rank(self) -> int:
        return self.num_experts // self.ep

    def owned(self) -> range:
        return range(self.ep_rank * self.per_rank, (self.ep_rank + 1) * self.per_rank)


@attrs.frozen
class ExpertGroups:
    """The EP group (token exchange) and the holders of this rank's experts (None: alone)."""

    ep: Any
    holders: Any


class AbsentExpert(nn.Module):
    """Placeholder for an expert another EP rank keeps (keeps the owned experts' names)."""


def build_ep_mesh(device_type: str, world_size: int, ep: int) -> DeviceMesh:
    """(ep_shard, ep) over all ranks: EP groups of ``ep`` consecutive ranks."""
    from torch.distributed.device_mesh import DeviceMesh

    ranks = torch.arange(world_size).reshape(world_size // ep, ep)
    return DeviceMesh(device_type, ranks, mesh_dim_names=EP_MESH_DIM_NAMES)


def moe_blocks(hf_model: Any) -> list[nn.Module]:
    """The MoE blocks of a decoder (``layer.mlp``; Mixtral: ``layer.block_sparse_moe``;
    Nemotron-H: ``layer.mixer``; Gemma 4: the layer itself, where it has experts)."""
    blocks = []
    for layer in decoder_layers(hf_model):
        if (
            type(layer).__name__ in EXPERT_CALL_LAYERS
            and getattr(layer, "experts", None) is not None
        ):
            blocks.append(layer)
        for attribute in ("mlp", "block_sparse_moe", "mixer"):
            block = getattr(layer, attribute, None)
            if type(block).__name__ in MOE_BLOCKS:
                blocks.append(block)
    return blocks


def router_saving_context(hf_model: Any) -> Any:
    """NeMo Automodel's ``ignore_router_for_ac``: a selective-checkpoint context that keeps
    the MoE routers' projections (the ``gate`` linears of ``moe_blocks``) from the forward
    pass, so a recomputed block routes its tokens as the forward did. The projections are
    found by their weight's shape as they reach the dispatcher (mm against the transposed
    weight, addmm with a bias, or linear), as Automodel does."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    shapes = {tuple(_router_weight(block).shape) for block in moe_blocks(hf_model)}
    shapes |= {shape[::-1] for shape in shapes}
    aten = torch.ops.aten
    weight_at = {aten.mm.default: 1, aten.addmm.default: 2, aten.linear.default: 1}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        where = weight_at.get(func)
        if where is not None and len(args) > where and tuple(args[where].shape) in shapes:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return lambda: create_selective_checkpoint_contexts(policy)


def _router_weight(block: nn.Module) -> torch.Tensor:
    """The weight projecting a block's tokens onto its experts (Gemma 4: ``router.proj``;
    gpt-oss: the ``router`` itself)."""
    gate = getattr(block, "gate", None)
    if gate is not None:
        return gate.weight
    router: Any = block.router
    return router.proj.weight if hasattr(router, "proj") else router.weight


def check_expert_parallel(hf_model: Any, ep: int) -> int:
    """The model's expert count; ValueError when EP over ``ep`` ranks cannot apply to it."""
    key = "policy.automodel_cfg.expert_parallel_size"
    blocks = moe_blocks(hf_model)
    if not blocks:
        raise ValueError(
            f"{key}={ep}: {type(hf_model).__name__} has no MoE layers of a supported kind "
            f"({', '.join(MOE_BLOCKS)}); set {key}=1"
        )
    num_experts = len(blocks[0].experts)
    if num_experts % ep:
        raise ValueError(
            f"{key}={ep} does not divide the model's {num_experts} experts; "
            f"set {key} to a divisor of {num_experts}"
        )
    if getattr(blocks[0], "jitter_noise", 0.0):
        raise ValueError(
            f"{key}={ep}: router_jitter_noise > 0 would draw different noise on each EP rank; "
            "set policy.hf_config_overrides.router_jitter_noise=0"
        )
    return num_experts


def apply_expert_parallel(
    hf_model: Any, ep_mesh: DeviceMesh, fsdp_kwargs: dict[str, Any]
) -> ExpertLayout:
    """Keep this rank's experts, FSDP-shard them over ``ep_mesh["ep_shard"]`` with
    ``fsdp_kwargs`` (mixed precision, offload), and route every MoE block through the EP
    group ``ep_mesh["ep"]``. Run before ``apply_fsdp`` (which then skips the experts)."""
    from torch.distributed.fsdp import fully_shard

    unfuse_experts(hf_model)  # EP keeps whole experts: the per-expert layout (no-op if so)
    ep_group = ep_mesh.get_group("ep")
    ep = ep_mesh["ep"].size()
    holders = ep_mesh.get_group("ep_shard") if ep_mesh["ep_shard"].size() > 1 else None
    groups = ExpertGroups(ep=ep_group, holders=holders)
    layout = ExpertLayout(check_expert_parallel(hf_model, ep), ep, ep_mesh.get_local_rank("ep"))
    owned = set(layout.owned())
    for block in moe_blocks(hf_model):
        for index in range(layout.num_experts):
            if index not in owned:
                block.experts[index] = AbsentExpert()
                continue
            expert = block.experts[index]
            expert.register_forward_pre_hook(_scale_input_gradient(ep))
            expert.register_forward_hook(_scale_output_gradient(ep))
            fully_shard(expert, mesh=ep_mesh["ep_shard"], **fsdp_kwargs)
            for param in expert.parameters():
                setattr(param, EXPERT_GROUP_ATTR, ep_group)
        if type(block).__name__ in EXPERT_CALL_LAYERS:
            experts = block.experts
            experts.forward = types.MethodType(_expert_call_forward(layout, groups), experts)
        else:
            block.forward = types.MethodType(_expert_parallel_forward(layout, groups), block)
    hf_model.expert_layout = layout
    return layout


def pin_backward_prefetch(hf_model: Any) -> None:
    """After ``apply_fsdp``: every decoder layer prefetches the previous one in backward, and
    no owned expert prefetches anything. FSDP2's own choice is the unit before it in this
    rank's forward order, which holds the experts this rank ran: a rank whose experts got no
    token in a layer would issue the previous layer's all-gather at another point of the
    backward than its EP peers, crossing their exchange's collectives (gloo: a size mismatch)."""
    layers = decoder_layers(hf_model)
    for previous, layer in zip(layers, layers[1:], strict=False):
        layer.set_modules_to_backward_prefetch([previous])
    for block in moe_blocks(hf_model):
        for expert in block.experts:
            if not isinstance(expert, AbsentExpert):
                # a non-empty list turns the default off; unsharding itself again is a no-op
                expert.set_modules_to_backward_prefetch([expert])


def _scale_input_gradient(ep: int) -> Any:
    def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        del module
        return (_GradScale.apply(args[0], float(ep)),)

    return hook


def _scale_output_gradient(ep: int) -> Any:
    # Together with the input hook: the weights' gradients scaled by 1/ep, the tokens' not.
    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        del module, args
        return _GradScale.apply(output, 1.0 / ep)

    return hook


class _GradScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def _expert_parallel_forward(layout: ExpertLayout, groups: ExpertGroups) -> Any:
    def forward(block: nn.Module, hidden_states: torch.Tensor) -> Any:
        batch, length, hidden = hidden_states.shape
        local = hidden_states.reshape(-1, hidden)
        sizes = _group_token_counts(local.shape[0], groups.ep, local.device)
        gathered = _GatherTokens.apply(local, groups.ep, sizes)
        router_logits, weights, selected = _route(block, gathered)
        selected = selected.masked_fill(~_real_rows(sizes, local.device)[:, None], -1)
        # Nemotron-H's experts may work in a latent space: in through fc1, out through fc2
        into, out_of = (getattr(block, name, None) for name in LATENT_PROJECTIONS)
        expert_in = gathered if into is None else into(gathered)
        partial = _partial_output(block.experts, layout, groups, expert_in, weights, selected)
        out = _SumToOwner.apply(partial, groups.ep, sizes)
        if out_of is not None:
            out = out_of(out)
        out = out.reshape(batch, length, hidden)
        out = out + _shared_output(block, hidden_states)
        if type(block).__name__ in PAIR_RETURNING_BLOCKS:
            return out, None  # the decoder layer drops the scores (no auxiliary loss here)
        if router_logits is None:
            return out  # the block returns its hidden states alone
        rank = dist.get_rank(groups.ep)
        start = rank * max(sizes)
        return out, router_logits[start : start + sizes[rank]]

    return forward


def _shared_output(block: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor | float:
    """What a block's shared experts add for this rank's own tokens (0 without them):
    DeepSeek-V3's and Nemotron-H's as they are, Qwen3.5's scaled by its sigmoid gate."""
    shared = getattr(block, "shared_experts", None)
    if shared is not None:
        return shared(hidden_states)
    expert, gate = (getattr(block, name, None) for name in GATED_SHARED_EXPERT)
    if expert is None or gate is None:
        return 0.0
    return torch.sigmoid(gate(hidden_states)) * expert(hidden_states)


def _expert_call_forward(layout: ExpertLayout, groups: ExpertGroups) -> Any:
    """``experts(tokens [T, H], indices [T, k], weights [T, k]) → [T, H]`` over the EP group:
    the tokens and their routing gathered, this rank's experts run, the sum kept per rank."""

    def forward(
        experts: nn.Module, tokens: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        sizes = _group_token_counts(tokens.shape[0], groups.ep, tokens.device)
        gathered = _GatherTokens.apply(tokens, groups.ep, sizes)
        gathered_weights = _GatherTokens.apply(weights, groups.ep, sizes)
        with torch.no_grad():
            selected = _GatherTokens.apply(indices, groups.ep, sizes)
        selected = selected.masked_fill(~_real_rows(sizes, tokens.device)[:, None], -1)
        partial = _partial_output(experts, layout, groups, gathered, gathered_weights, selected)
        return _SumToOwner.apply(partial, groups.ep, sizes)

    return forward


def _partial_output(
    experts: Any,
    layout: ExpertLayout,
    groups: ExpertGroups,
    tokens: torch.Tensor,
    weights: torch.Tensor,
    selected: torch.Tensor,
) -> torch.Tensor:
    """This rank's experts run on the gathered tokens routed to them, weighted, summed: the
    rank's share of the group's output (zero rows where none of its experts was chosen)."""
    # Zeros that stay on the autograd graph: where none of this rank's experts gets a token,
    # the exchange's backward collectives still run here as on the other EP ranks, and the
    # router gets its (zero) gradient, without which FSDP2 would leave it out of the layer's
    # reduce-scatter here and not on the other ranks.
    partial = tokens * 0.0 + weights.sum() * 0.0
    for index in _experts_to_run(layout, selected, groups.holders):
        rows, slot = torch.where(selected == index)
        expert_out = experts[index](tokens[rows]) * weights[rows, slot, None]
        partial = partial.index_add(0, rows, expert_out.to(tokens.dtype))
    return partial


def _route(
    block: nn.Module, tokens: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The block's own routing of ``tokens``: (router logits for the block's output, or None
    where the block returns its hidden states alone; top-k weights; expert indices).

    transformers 5's routers return (logits, weights, indices) and their blocks hidden
    states alone; transformers 4's DeepSeek-V3 router returns (indices, weights); its
    Qwen3-MoE and Mixtral ``gate`` is the linear projection, routed here as those blocks do
    (softmax → top-k (→ renormalised)), and those blocks return their router logits too."""
    router = getattr(block, "gate", None)
    routed = (block.router if router is None else router)(tokens)
    if type(block).__name__ == "GptOssMLP" and len(routed) == 2:
        scores, selected = routed  # transformers 4: dense scores [T, E], zero off the top-k
        return None, scores.gather(-1, selected), selected
    if isinstance(routed, tuple) and len(routed) == 3:
        _, weights, selected = routed
        return None, weights, selected  # weights as transformers' own loop uses them
    if isinstance(routed, tuple):
        selected, weights = routed
        return None, weights, selected
    weights = F.softmax(routed, dim=1, dtype=torch.float)
    weights, selected = torch.topk(weights, block.top_k, dim=-1)
    renormalise = MOE_BLOCKS[type(block).__name__]
    if renormalise if renormalise is not None else block.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return routed, weights.to(tokens.dtype), selected


def _real_rows(sizes: list[int], device: torch.device) -> torch.Tensor:
    """Which rows of the gathered tokens are tokens (not the padding up to the longest rank)."""
    longest = max(sizes)
    position = torch.arange(longest, device=device)
    return torch.cat([position < size for size in sizes])


def _experts_to_run(layout: ExpertLayout, selected: torch.Tensor, holders: Any) -> list[int]:
    """This rank's experts that some token of the whole data-parallel batch is routed to.

    One process skips an expert no token reaches (no gradient: AdamW leaves it alone, no
    weight decay, no momentum step); so does EP, and it decides it from the count over all
    the expert's holders, so that they run (and FSDP-reduce) the same experts: an expert
    some other group routes tokens to runs here on no tokens."""
    owned = list(layout.owned())
    counts = torch.stack([(selected == index).sum() for index in owned])
    if holders is not None:
        dist.all_reduce(counts, group=holders)
    return [index for index, count in zip(owned, counts.tolist(), strict=True) if count > 0]


def _group_token_counts(count: int, group: Any, device: torch.device) -> list[int]:
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(group.size())]
    dist.all_gather(counts, torch.tensor([count], dtype=torch.long, device=device), group=group)
    return [int(c) for c in torch.cat(counts).tolist()]


class _GatherTokens(torch.autograd.Function):
    """[T_r, H] per rank → [ep·T_max, H] (rank q's tokens at rows q·T_max …, zero-padded)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
        ctx.group, ctx.sizes = group, sizes
        longest = max(sizes)
        padded = F.pad(local, (0, 0, 0, longest - local.shape[0])).contiguous()
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        rank, longest = dist.get_rank(ctx.group), max(ctx.sizes)
        return total[rank * longest : rank * longest + ctx.sizes[rank]], None, None


class _SumToOwner(torch.autograd.Function):
    """[ep·T_max, H] partial outputs per rank → the sum over ranks, this rank's rows."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
        ctx.group, ctx.sizes = group, sizes
        total = partial.contiguous().clone()
        dist.all_reduce(total, group=group)
        rank, longest = dist.get_rank(group), max(sizes)
        return total[rank * longest : rank * longest + sizes[rank]]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        longest = max(ctx.sizes)
        padded = F.pad(grad, (0, 0, 0, longest - grad.shape[0])).contiguous()
        parts = [torch.empty_like(padded) for _ in ctx.sizes]
        dist.all_gather(parts, padded, group=ctx.group)
        return torch.cat(parts), None, None


def gather_expert_tensors(
    named: list[tuple[str, torch.Tensor]], layout: ExpertLayout, group: Any
) -> list[tuple[str, torch.Tensor]]:
    """Full (unsharded) ``named`` weights of this rank → the same list with every EP rank's
    experts (all ranks of the group call it together). Expert names: ``….experts.<i>.…``."""
    other = [(name, tensor) for name, tensor in named if ".experts." not in name]
    experts = {name: tensor for name, tensor in named if ".experts." in name}
    first = layout.owned()[0]
    templates = sorted(name for name in experts if f".experts.{first}." in name)
    gathered: list[tuple[str, torch.Tensor]] = []
    for template in templates:
        prefix, suffix = template.split(f".experts.{first}.", 1)
        stacked = torch.stack([
            experts[f"{prefix}.experts.{i}.{suffix}"] for i in layout.owned()
        ]).contiguous()  # fmt: skip
        parts = [torch.empty_like(stacked) for _ in range(layout.ep)]
        dist.all_gather(parts, stacked, group=group)
        for index, tensor in enumerate(torch.cat(parts)):
            gathered.append((f"{prefix}.experts.{index}.{suffix}", tensor))
    return other + gathered
