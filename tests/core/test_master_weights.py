"""Compute copies of the linear weights with ``MasterWeightAdam``
(``hpcrl.core.backends.automodel.master_weights`` / ``master_adam``) against what they
replace: fp32 weights under autocast, ``clip_gradients`` and torch's AdamW.

The optimizer's Triton kernel runs on CPU through Triton's interpreter (``TRITON_INTERPRET=1``,
set before any import in a child process, as tests/core/test_triton_attention.py explains);
autocast is CPU's bf16 autocast, which casts linear weights as CUDA's does. On the GPU the
same path runs in ``benchmarks/train_throughput.py`` (rows ``backend`` and ``backend-before``,
first losses equal) and in tests/gpu's GRPO jobs.
"""

from __future__ import annotations

import copy

import pytest

from tests.require import require_module
from tests.triton_interpreter import run_interpreted

torch = require_module("torch")
require_module("triton")
require_module("transformers")

MAX_NORM = 0.05  # small enough that every step clips


def tiny_root(tied: bool = False):
    """A 2-layer Llama in the backend's root module, autocast to bf16 as on a GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hpcrl.core.backends.automodel.model import TokenLogprobModel

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    hf = LlamaForCausalLM(config).float()
    hf.config.use_cache = False
    root = TokenLogprobModel(hf)
    root.autocast_dtype = torch.bfloat16
    return root


def _batches(count: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 96, (2, 12), generator=gen) for _ in range(count)]


def _train(root, optimizer, clip, batches, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        total = 0.0
        for ids in batches:
            logprobs, _ = root(ids, None)
            loss = -logprobs[:, 1:].mean() / len(batches)
            loss.backward()
            total += float(loss.detach())
        clip()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


def check_same_training_as_autocast(micro_batches: str, steps: str, device: str = "cpu") -> None:
    """AdamW steps (weight decay, every step clipped) of the same model and batches. The
    first loss is the same to the bit (same bf16 weights, same gradients); after one step the
    fp32 weights differ by float32 rounding of the update (one ulp: torch's AdamW orders its
    arithmetic otherwise, and fused AdamW on a GPU otherwise again); such a difference flips
    the bf16 rounding of a few weights, so later losses agree to 1e-3. Each copy is its
    weight in bf16. ``device`` "cuda": the compiled kernel on a GPU (run there by hand:
    docs/performance.md, issue 25 item 1)."""
    from hpcrl.core.backends.automodel.master_adam import MasterWeightAdam
    from hpcrl.core.backends.automodel.master_weights import apply_compute_copies
    from hpcrl.core.backends.automodel.optim import clip_gradients

    reference = tiny_root().to(device)
    root = copy.deepcopy(reference)
    copies = apply_compute_copies(root.hf, torch.bfloat16)
    root.compute_copies = copies
    copies.sum_in_fp32 = int(micro_batches) > 1
    assert len(copies) == 2 * 7 + 1  # q k v o gate up down per layer, and the lm_head

    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    ref_params = list(reference.parameters())
    ref_optimizer = torch.optim.AdamW(ref_params, foreach=False, **kwargs)
    optimizer = MasterWeightAdam(
        list(root.parameters()), copies, decoupled_weight_decay=True, **kwargs
    )
    batches = [ids.to(device) for ids in _batches(int(micro_batches))]

    count = int(steps)
    want = _train(reference, ref_optimizer, lambda: clip_gradients(ref_params, MAX_NORM),
                  batches, steps=count)  # fmt: skip
    got = _train(root, optimizer, lambda: optimizer.clip_before_step(MAX_NORM), batches, count)

    assert got[0] == want[0]
    if count > 1:
        assert want[-1] < want[0], want  # it trains
        torch.testing.assert_close(got, want, rtol=1e-3, atol=0)
    for (name, mine), theirs in zip(root.named_parameters(), ref_params, strict=True):
        if count > 1:
            # Adam moves each weight by ~lr whatever its gradient's size: after a flipped
            # bf16 rounding a weight whose gradient is near 0 may move the other way
            # (elementwise up to 2 lr; seen on an H100). The tensor as a whole stays close.
            error = torch.linalg.vector_norm(mine - theirs) / torch.linalg.vector_norm(theirs)
            assert error < 1e-2, (name, float(error))
            continue
        one_ulp = 1.2e-7  # the weights are below 1 in magnitude
        torch.testing.assert_close(mine, theirs, rtol=0, atol=2 * one_ulp, msg=name)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                optimizer.state[mine][key], ref_optimizer.state[theirs][key],
                rtol=1e-5, atol=1e-9, msg=f"{name} {key}",
            )  # fmt: skip
    for weight, compute in copies.pairs:
        assert torch.equal(compute, weight.detach().to(torch.bfloat16))
        assert compute.grad is None and weight.grad is None  # zero_grad dropped both


def check_state_dict_is_adamw_s() -> None:
    """A checkpoint of this optimizer loads into torch's AdamW and back, same state."""
    from hpcrl.core.backends.automodel.master_adam import MasterWeightAdam
    from hpcrl.core.backends.automodel.master_weights import apply_compute_copies

    root = tiny_root()
    copies = apply_compute_copies(root.hf, torch.bfloat16)
    root.compute_copies = copies
    params = list(root.parameters())
    optimizer = MasterWeightAdam(params, copies, decoupled_weight_decay=True, lr=1e-2)
    _train(root, optimizer, lambda: optimizer.clip_before_step(1.0), _batches(1), steps=2)

    plain = torch.optim.AdamW(params, lr=1e-2)
    plain.load_state_dict(optimizer.state_dict())
    # torch's defaults, not a pinned slow path, for a run that resumes without copies
    assert all(g["foreach"] is None and g["fused"] is None for g in plain.param_groups)
    fused = torch.optim.AdamW(params, lr=1e-2, fused=True)  # its steps live with the weights
    fused.load_state_dict(plain.state_dict())
    back = MasterWeightAdam(params, copies, decoupled_weight_decay=True, lr=1e-2)
    back.load_state_dict(fused.state_dict())
    assert all(g["foreach"] is None and g["fused"] is None for g in back.param_groups)
    for param in params:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(back.state[param][key], optimizer.state[param][key]), key
        assert back.state[param]["step"].device.type == "cpu"  # read without a device wait


def check_checkpoint_round_trip(folder: str) -> None:
    """The worker's checkpoint (torch DCP) of a model with copies and its optimizer loads
    into a fresh one: same weights, moments and steps; the copies are made again from the
    loaded weights; the next step is the same on both."""
    import socket

    import torch.distributed as dist

    from hpcrl.core.backends.automodel import checkpoint
    from hpcrl.core.backends.automodel.master_adam import MasterWeightAdam
    from hpcrl.core.backends.automodel.master_weights import apply_compute_copies

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

    def build(seed: int):
        torch.manual_seed(seed)
        root = tiny_root()
        with torch.no_grad():  # different weights per seed
            for param in root.parameters():
                param.add_(torch.randn_like(param) * 0.01)
        root.compute_copies = apply_compute_copies(root.hf, torch.bfloat16)
        optimizer = MasterWeightAdam(
            list(root.parameters()), root.compute_copies, decoupled_weight_decay=True, lr=1e-2
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return root, optimizer, scheduler

    batches = _batches(1)
    saved, saved_optimizer, saved_scheduler = build(1)
    _train(saved, saved_optimizer, lambda: saved_optimizer.clip_before_step(1.0), batches, 2)
    checkpoint.save(folder, saved, saved_optimizer, saved_scheduler, step=2)
    loaded, optimizer, scheduler = build(2)
    assert checkpoint.load(folder, loaded, optimizer, scheduler) == 2

    for (name, mine), theirs in zip(loaded.named_parameters(), saved.parameters(), strict=True):
        assert torch.equal(mine, theirs), name
        for key in ("step", "exp_avg", "exp_avg_sq"):
            want = saved_optimizer.state[theirs][key]
            assert torch.equal(optimizer.state[mine][key], want), (name, key)
        assert optimizer.state[mine]["step"].device.type == "cpu"
    after = [
        _train(root, opt, lambda o=opt: o.clip_before_step(1.0), batches, 1)
        for root, opt in ((saved, saved_optimizer), (loaded, optimizer))
    ]
    assert after[0] == after[1], after  # the copies were made again from the loaded weights
    for weight, copy_ in loaded.compute_copies.pairs:
        assert torch.equal(copy_, weight.detach().to(torch.bfloat16))
    dist.destroy_process_group()


def test_checkpoint_round_trip_remakes_the_copies(tmp_path):
    run_interpreted(__name__, "check_checkpoint_round_trip", str(tmp_path / "ckpt"))


def test_one_step_matches_fp32_weights_under_autocast_with_torch_adamw():
    run_interpreted(__name__, "check_same_training_as_autocast", "1", "1")


def test_micro_batches_sum_their_gradients_in_fp32_as_autocast_does():
    run_interpreted(__name__, "check_same_training_as_autocast", "3", "1")


def test_three_steps_train_as_fp32_weights_under_autocast_do():
    run_interpreted(__name__, "check_same_training_as_autocast", "2", "3")


def test_optimizer_state_dict_loads_into_torch_adamw_and_back():
    run_interpreted(__name__, "check_state_dict_is_adamw_s")


def test_copies_cover_trained_linears_only_and_leave_state_dict_alone():
    from hpcrl.core.backends.automodel.master_weights import (
        ComputeCopyLinear,
        apply_compute_copies,
    )

    root = tiny_root(tied=True)
    root.hf.model.layers[1].mlp.down_proj.weight.requires_grad_(False)
    keys = set(root.state_dict())
    copies = apply_compute_copies(root.hf, torch.bfloat16)

    # 14 linears, less the frozen one; the tied lm_head is the embedding's weight too
    assert len(copies) == 13
    assert not isinstance(root.hf.lm_head, ComputeCopyLinear)
    assert not isinstance(root.hf.model.layers[1].mlp.down_proj, ComputeCopyLinear)
    assert set(root.state_dict()) == keys  # copies are non-persistent buffers
    assert all(p.dtype == torch.float32 for p in root.parameters())


def test_a_weight_written_in_place_is_copied_again_before_the_next_forward():
    from hpcrl.core.backends.automodel.master_weights import apply_compute_copies

    root = tiny_root()
    reference = copy.deepcopy(root)
    root.compute_copies = apply_compute_copies(root.hf, torch.bfloat16)
    ids = _batches(1)[0]
    with torch.no_grad():
        for model in (root, reference):  # a checkpoint load writes the weights in place
            model.hf.model.layers[0].self_attn.q_proj.weight.mul_(3.0)
            model.hf.lm_head.weight.add_(0.5)
        got, _ = root(ids, None)
        want, _ = reference(ids, None)
    assert root.compute_copies.refresh() == 0  # the forward copied both already
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "change, takes",
    [
        ({}, True),
        ({"on_gpu": False}, False),
        ({"precision": "float32"}, False),
        ({"optimizer_offload_fraction": 0.5}, False),
        ({"kwargs": {"lr": 1e-5, "amsgrad": True}}, False),
        ({"kwargs": {"lr": 1e-5, "foreach": False, "fused": False}}, True),
        ({"name": "torch.optim.SGD"}, False),
    ],
)
def test_takes_master_weights_only_where_it_steps_as_torch_does(change, takes):
    import attrs

    from hpcrl.config.recipe import OptimizerCfg
    from hpcrl.core.backends.automodel.master_weights import takes_master_weights
    from tests.recipe_builder import tiny_automodel_recipe, with_automodel

    recipe = tiny_automodel_recipe()
    optimizer = OptimizerCfg(
        name=change.get("name", "torch.optim.AdamW"), kwargs=change.get("kwargs", {"lr": 1e-5})
    )
    policy = attrs.evolve(
        recipe.policy, precision=change.get("precision", "bfloat16"), optimizer=optimizer
    )
    recipe = attrs.evolve(recipe, policy=policy)
    if "optimizer_offload_fraction" in change:
        recipe = with_automodel(recipe, optimizer_offload_fraction=0.5)
    assert takes_master_weights(recipe, on_gpu=change.get("on_gpu", True)) is takes


def check_global_norm(device: str = "cpu") -> None:
    """``GlobalNorm`` over bf16 and float32 gradients, some spanning several chunks, one
    smaller than a block: the float32 norm of them all, to float32 rounding; deterministic."""
    from hpcrl.core.backends.automodel import grad_norm

    grad_norm.CHUNK_NUMEL = 4096  # several programs per gradient below
    gen = torch.Generator().manual_seed(3)
    sizes = [(3,), (70, 130), (9000,), (4096,), (2, 2048)]
    grads = [torch.randn(size, generator=gen) * (index + 1) for index, size in enumerate(sizes)]
    grads = [g.to(device, torch.bfloat16 if i % 2 else torch.float32) for i, g in enumerate(grads)]
    want = torch.linalg.vector_norm(torch.cat([g.float().reshape(-1) for g in grads]))
    norm = grad_norm.GlobalNorm()
    copies = []  # one copy of the addresses per call: on a GPU a second one waits for the first
    addresses = norm._addresses
    norm._addresses = lambda pointers, where: (
        copies.append(len(pointers)) or addresses(pointers, where)
    )
    got = norm(grads)
    assert copies == [len(grads)], copies
    assert got.dtype == torch.float32 and got.device.type == torch.device(device).type
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    again = [g.clone() for g in grads]  # new addresses, the same shapes: the tables are kept
    assert torch.equal(norm(again), got) and len(norm._tables) == 2
    assert not grad_norm.GlobalNorm.takes([grads[1].t()])  # not contiguous: torch's path


def test_the_global_norm_is_one_launch_per_dtype_and_torch_s_norm():
    run_interpreted(__name__, "check_global_norm")
