"""Single-process pieces of the Automodel backend: chunked token log-probs, LR schedules,
gradient clipping, and the setup errors for layouts and options it cannot run."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

from hpcrl.core.backends.automodel.model import token_logprobs
from hpcrl.core.backends.automodel.optim import clip_gradients
from hpcrl.core.backends.automodel.parallelize import (
    MeshShape,
    _sequence_parallel_block_plan,
    parallelize_steps,
)
from hpcrl.core.backends.automodel.worker import _check_supported
from hpcrl.core.token_distribution import LogitTransform, TokenDistribution
from tests.recipe_builder import tiny_automodel_recipe, with_automodel


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64, 10_000])
@pytest.mark.parametrize("temperature, softcap", [(1.0, None), (0.7, 3.0)])
@pytest.mark.parametrize("keep_bytes", [0, 1 << 30], ids=["recomputed", "kept"])
def test_chunked_logprobs_equal_full_softmax_in_value_and_gradient(
    chunk_tokens, temperature, softcap, keep_bytes
):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 9, 16, generator=gen, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, requires_grad=True)
    ids = torch.randint(0, 50, (3, 9), generator=gen)

    got, unfiltered = token_logprobs(
        hidden,
        weight,
        ids,
        chunk_tokens,
        transform=LogitTransform(softcap=softcap),
        dist=TokenDistribution(temperature=temperature),
        keep_bytes=keep_bytes,
    )
    logits = hidden @ weight.T
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    full = torch.log_softmax(logits / temperature, dim=-1)[:, :-1]
    full = full.gather(-1, ids[:, 1:, None])[..., 0]
    want = torch.cat([torch.zeros(3, 1), full], dim=1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert unfiltered is got or torch.equal(unfiltered, got)  # no top-k/top-p: one tensor

    upstream = torch.randn(3, 9, generator=gen)
    got_grads = torch.autograd.grad((got * upstream).sum(), (hidden, weight))
    want_grads = torch.autograd.grad((want * upstream).sum(), (hidden, weight))
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


# LR schedules (NeMo RL's torch scheduler list): tests/core/test_optim.py.


def test_clip_gradients_matches_torch_and_reports_norm_before_clipping():
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(5, 3, generator=gen)) for _ in range(2)]
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, c in zip(params, copies, strict=True):
        p.grad = torch.randn(p.shape, generator=gen)
        c.grad = p.grad.clone()

    norm = float(clip_gradients(params, max_norm=0.5))
    want_norm = torch.nn.utils.clip_grad_norm_(copies, max_norm=0.5)

    assert norm == pytest.approx(float(want_norm), rel=1e-6)
    assert norm > 0.5
    for p, c in zip(params, copies, strict=True):
        torch.testing.assert_close(p.grad, c.grad)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_clip_gradients_leaves_gradients_alone_when_the_norm_is_not_finite(bad):
    # Decided on the device (no host read before the optimizer step), as the host's check
    # did: the gradients stay as they were, the norm is reported as it is.
    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    params[0].grad = torch.tensor([1.0, bad, 2.0])
    params[1].grad = torch.tensor([4.0, 5.0, 6.0])
    before = [p.grad.clone() for p in params]

    norm = clip_gradients(params, max_norm=0.5)

    assert isinstance(norm, torch.Tensor) and not torch.isfinite(norm)
    for param, grad in zip(params, before, strict=True):
        torch.testing.assert_close(param.grad, grad, equal_nan=True)


def test_mesh_shape_derives_dp_shard_and_rejects_layouts_that_do_not_factor():
    assert MeshShape.for_world(8, dp_replicate=2, tp=2) == MeshShape(
        dp_replicate=2, dp_shard=2, tp=2
    )
    with pytest.raises(ValueError, match="6 workers do not split into dp_replicate_size=4"):
        MeshShape.for_world(6, dp_replicate=4, tp=1)
    # CP peers share rows: dp counts dp_replicate × dp_shard only.
    shape = MeshShape.for_world(8, dp_replicate=1, tp=1, cp=4)
    assert (shape.dp_shard, shape.cp, shape.dp_size) == (2, 4, 2)
    with pytest.raises(ValueError, match="context_parallel_size=4 x dp_shard"):
        MeshShape.for_world(6, dp_replicate=1, tp=1, cp=4)


def test_unsupported_options_fail_at_setup_with_their_key():
    cp2 = with_automodel(tiny_automodel_recipe(), context_parallel_size=2)
    _check_supported(cp2)
    packed = attrs.evolve(
        cp2.policy, sequence_packing=attrs.evolve(cp2.policy.sequence_packing, enabled=True)
    )
    with pytest.raises(ValueError, match=r"context_parallel_size > 1 .*sequence_packing"):
        _check_supported(attrs.evolve(cp2, policy=packed))
    with pytest.raises(ValueError, match=r"context_parallel_size > 1 .* sequence_parallel"):
        _check_supported(with_automodel(cp2, tensor_parallel_size=2, sequence_parallel=True))
    _check_supported(tiny_automodel_recipe())  # the defaults are fine
    for tp in (1, 2):  # TP 1: nothing to split, ignored as in NeMo RL (a config warning)
        recipe = with_automodel(tiny_automodel_recipe(tp=tp), sequence_parallel=True)
        _check_supported(recipe)


def test_sequence_parallel_is_planned_with_tp_only_and_refuses_blocks_it_does_not_fit():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = with_automodel(tiny_automodel_recipe(), sequence_parallel=True).policy.automodel_cfg
    shapes = [MeshShape(dp_replicate=1, dp_shard=1, tp=tp) for tp in (1, 2)]
    steps = [
        parallelize_steps(cfg, "float32", s, on_gpu=False, compiles=False, training=True)
        for s in shapes
    ]
    planned = [s.sequence_parallel for s in steps]
    assert planned == [False, True]

    sizes = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, num_hidden_layers=1, **sizes))
    assert set(_sequence_parallel_block_plan(model)) >= {"input_layernorm", "mlp.down_proj"}
    model.model.layers[0].pre_feedforward_layernorm = torch.nn.Identity()  # Gemma 3's block
    model.model.layers[0].post_feedforward_layernorm = torch.nn.Identity()
    assert set(_sequence_parallel_block_plan(model)) >= {"post_feedforward_layernorm"}
    model.model.layers[0].router = torch.nn.Identity()  # a block the plan does not know
    refusal = r"^policy.automodel_cfg.sequence_parallel: .*'router'.*false$"
    with pytest.raises(ValueError, match=refusal):
        _sequence_parallel_block_plan(model)


def test_chunks_recompute_their_logits_only_above_the_kept_bytes():
    # A chunk kept for backward holds its fp32 log-softmax; a recomputed one runs the
    # lm_head again in backward: counted through a module head's forward calls.
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    head = torch.nn.Linear(8, 10, bias=False)
    calls = []
    head.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.randint(0, 10, (2, 5))
    targets = 2 * 4  # rows x shifted positions
    for keep_bytes, forwards in [(targets * 10 * 4, 1), (targets * 10 * 4 - 1, 2)]:
        calls.clear()
        got, _ = token_logprobs(hidden, head, ids, chunk_tokens=100, keep_bytes=keep_bytes)
        got.sum().backward()
        assert len(calls) == forwards, (keep_bytes, len(calls))


@pytest.mark.parametrize("dp_shard", [1, 2])
def test_only_the_reference_moves_to_the_host_and_keeps_the_policys_mixed_precision(dp_shard):
    """``reference_on_host`` plans FSDP's CPU offload for the reference (eager, every block
    resharded, page-locked on a GPU), never for the trained model; the reference computes in
    the policy's mixed precision (autocast beside a plain one-GPU policy, FSDP's bf16 params
    beside an FSDP policy)."""
    cfg = with_automodel(tiny_automodel_recipe(), reference_on_host=True).policy.automodel_cfg
    shape = MeshShape(dp_replicate=1, dp_shard=dp_shard, tp=1)

    def plan(training: bool) -> Any:
        return parallelize_steps(cfg, "bfloat16", shape, on_gpu=True, compiles=True,
                                 training=training)  # fmt: skip

    policy, reference = plan(True), plan(False)
    assert (policy.cpu_offload, policy.reshard_every_block) == (False, False)
    assert policy.compile and policy.fsdp == (dp_shard > 1)
    assert (reference.fsdp, reference.cpu_offload, reference.reshard_every_block) == (True,) * 3
    assert not reference.compile and reference.pin_memory
    assert policy.fsdp_mixed_precision == reference.fsdp_mixed_precision == (dp_shard > 1)
