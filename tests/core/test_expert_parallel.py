"""Expert parallelism on the Automodel backend (``hpcrl.core.backends.automodel.expert_parallel``)
with real torch.distributed on CPU: 2 gloo ranks, a tiny Qwen3-MoE model built locally.

EP=2 (each rank keeps half of the experts, FSDP2 over both ranks for the rest) and EP=1
(plain FSDP2 over both ranks) take the same AdamW steps on the same per-rank batches as one
process over the whole batch: same losses, same gradient norms, same updated weights.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.require import require_module

STEPS = 2
LR = 1e-2  # an AdamW step moves each weight by ~LR: atol 2e-5 is 0.2% of one
MAX_NORM = 0.5


def build_tiny_moe(path: Path, model_type: str = "qwen3_moe") -> str:
    require_module("transformers")
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

    torch.manual_seed(0)
    common = dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts_per_tok=2,
        max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    if model_type == "qwen3_moe_sparse":  # 16 experts, top-1: some get no token on a rank
        common["num_experts_per_tok"] = 1
        config: Any = Qwen3MoeConfig(num_experts=16, moe_intermediate_size=8, **common)
    elif model_type == "qwen3_moe":
        config = Qwen3MoeConfig(
            num_experts=4, moe_intermediate_size=16, norm_topk_prob=True, **common
        )
    elif model_type == "deepseek_v3":  # MLA, a dense first block, routed + shared experts
        from transformers import DeepseekV3Config

        config = DeepseekV3Config(
            n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=16,
            first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
            **{**common, "num_key_value_heads": 4},
        )  # fmt: skip
    else:
        config = MixtralConfig(num_local_experts=4, **common)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    from hpcrl.core.models.tiny import build_char_tokenizer

    build_char_tokenizer().save_pretrained(path)  # hpcrl export writes one beside the weights
    return str(path)


def rank_batches(rank: int, world: int) -> list[torch.Tensor]:
    """Per step: this rank's rows of one global batch (ranks get different lengths)."""
    out = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(step)
        full = torch.randint(0, 64, (world * 2, 12), generator=gen)
        rows = full[rank * 2 : rank * 2 + 2]
        out.append(rows[:, : 12 - 3 * rank])  # uneven token counts across the EP group
    return out


def nll(model: Any, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
    )


def global_tokens(world: int, step_batches: list[list[torch.Tensor]], step: int) -> float:
    return float(sum(b[step][:, 1:].numel() for b in step_batches))


def reference(model_path: str, world: int) -> tuple[list[float], list[float], dict]:
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.expert_layout import unfuse_experts

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    # One process of the model the backend trains: per-expert modules under transformers 5
    # too, where an expert no token reaches gets no gradient (expert_layout.py).
    unfuse_experts(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    per_rank = [rank_batches(r, world) for r in range(world)]
    losses, norms = [], []
    for step in range(STEPS):
        total = global_tokens(world, per_rank, step)
        loss = sum(nll(model, per_rank[r][step]) for r in range(world)) / total
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, norms, checkpoint_weights(model)


def checkpoint_weights(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights under the checkpoint's names (transformers 5 fuses experts)."""
    from hpcrl.core.backends.automodel.expert_layout import checkpoint_named_tensors

    state = [(k, v.detach().clone()) for k, v in model.state_dict().items()]
    return dict(checkpoint_named_tensors(model, state))


def _run_rank(
    rank: int, world: int, port: int, model_path: str, ep: int, checkpointing: bool, out: str
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.expert_layout import checkpoint_named_tensors
    from hpcrl.core.backends.automodel.expert_parallel import (
        apply_expert_parallel,
        build_ep_mesh,
        gather_expert_tensors,
        pin_backward_prefetch,
    )
    from hpcrl.core.backends.automodel.optim import clip_gradients
    from hpcrl.core.backends.automodel.parallelize import (
        MeshShape,
        apply_activation_checkpointing,
        apply_fsdp,
        build_mesh,
        data_parallel_mesh,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        shape = MeshShape.for_world(world, 1, 1)
        mesh = build_mesh("cpu", shape)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        layout, ep_mesh = None, build_ep_mesh("cpu", world, ep)
        if ep > 1:
            layout = apply_expert_parallel(model, ep_mesh, {})
        if checkpointing:  # backward recomputes each block: its exchange runs again
            apply_activation_checkpointing(model)
        apply_fsdp(
            model, model, data_parallel_mesh(mesh, shape), param_dtype=None, cpu_offload=False
        )
        if layout is not None:  # as the worker does
            pin_backward_prefetch(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        per_rank = [rank_batches(r, world) for r in range(world)]
        losses, norms = [], []
        for step in range(STEPS):
            total = global_tokens(world, per_rank, step)
            loss = nll(model, per_rank[rank][step]) / total
            (loss * world).backward()  # FSDP2 averages over dp (as the worker does)
            norms.append(float(clip_gradients(list(model.parameters()), MAX_NORM)))
            optimizer.step()
            optimizer.zero_grad()
            summed = loss.detach().clone()
            dist.all_reduce(summed)
            losses.append(float(summed))
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        named = [(k, v.detach().clone()) for k, v in state.items()]
        if layout is not None:
            named = gather_expert_tensors(named, layout, ep_mesh.get_group("ep"))
        named = checkpoint_named_tensors(model, named)
        torch.save({"losses": losses, "norms": norms, "weights": dict(named)}, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_cleanly()


def _exit_cleanly() -> None:
    """Leave without interpreter teardown: gloo threads outliving the process group abort
    ~20% of exits otherwise (SIGABRT after destroy_process_group, pytorch issue 190489)."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    model_path: str, world: int, ep: int, out: Path, checkpointing: bool = False
) -> list[dict]:
    mp.start_processes(
        _run_rank,
        args=(world, _free_port(), model_path, ep, checkpointing, str(out)),
        nprocs=world,
        start_method="fork",
    )
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]


@pytest.mark.parametrize(
    ("model_type", "world", "ep", "checkpointing"),
    [
        ("qwen3_moe", 2, 1, False),  # plain FSDP2: the baseline EP must equal
        ("qwen3_moe", 2, 2, False),  # EP over all dp ranks, experts unsharded
        ("mixtral", 2, 2, True),  # with activation checkpointing (recomputed exchange)
        # two EP groups: experts FSDP-sharded over their 2 holders, some routed no token in
        # one group and some in the other (their FSDP collectives must still pair up)
        ("qwen3_moe_sparse", 4, 2, False),
        ("deepseek_v3", 2, 2, False),  # NeMo RL's Moonlight/DeepSeek-V3 EP recipes
    ],
)
def test_expert_parallel_matches_one_process_in_loss_norm_and_updated_weights(
    tmp_path, model_type, world, ep, checkpointing
):
    model_path = build_tiny_moe(tmp_path / "moe", model_type)
    want_losses, want_norms, want_weights = reference(model_path, world=world)
    results = run_ranks(model_path, world, ep, tmp_path / "result", checkpointing)
    for result in results:
        assert result["losses"] == pytest.approx(want_losses, rel=1e-5)
        assert result["norms"] == pytest.approx(want_norms, rel=1e-5)
        assert sorted(result["weights"]) == sorted(want_weights)
        # AdamW (lr 1e-2) normalises each update: an element whose gradient is near zero
        # turns the all-reduce's summation order into an update difference (CI, one OpenMP
        # thread: 2.3e-5 on 1 of 256); a wrong expert or group moves elements by ~1e-2
        for name, tensor in want_weights.items():
            torch.testing.assert_close(result["weights"][name], tensor, atol=1e-4, rtol=1e-5)
    # The steps moved the experts: the comparison is not one of untouched weights (under
    # the sparse routing an expert no token of the batch reaches keeps its weights).
    from transformers import AutoModelForCausalLM

    initial = checkpoint_weights(AutoModelForCausalLM.from_pretrained(model_path))
    experts = [name for name in want_weights if ".experts." in name]
    moved = [name for name in experts if not torch.equal(initial[name], want_weights[name])]
    assert len(moved) >= 0.75 * len(experts), sorted(set(experts) - set(moved))


def _worker_rank(rank: int, world: int, port: int, model_path: str, out: str) -> None:
    """The Automodel worker itself at EP=2: one train step on this rank's rows, its weights
    for refit and as an HF export, then a checkpoint saved and loaded into a fresh worker at
    EP=2 and into one without EP."""
    import attrs

    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from tests.core.parallel_harness import make_batch, masked_nll_loss
    from tests.recipe_builder import tiny_automodel_recipe, with_automodel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        recipe = with_automodel(tiny_automodel_recipe(lr=5e-3), expert_parallel_size=2)
        recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, model_name=model_path))
        info = RankInfo(rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                        node_rank=0, master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
        worker = AutomodelWorker()
        worker.setup(recipe, info, model_path)
        batch = make_batch(seed=5, vocab=64)
        rows = {key: value[rank * 4 : rank * 4 + 4] for key, value in batch.items()}
        micro = [{key: value[i : i + 2] for key, value in rows.items()} for i in (0, 2)]
        metrics = worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))
        trained = dict(worker.export_hf_weights())
        worker.export_hf(f"{out}.hf")
        worker.save_checkpoint(f"{out}.ckpt")
        worker.close()
        fresh = AutomodelWorker()
        fresh.setup(recipe, info, model_path)
        fresh.load_checkpoint(f"{out}.ckpt")
        loaded = dict(fresh.export_hf_weights())
        fresh.close()
        plain = AutomodelWorker()  # the same checkpoint resumed without EP (DCP reshards)
        plain.setup(with_automodel(recipe, expert_parallel_size=1), info, model_path)
        plain.load_checkpoint(f"{out}.ckpt")
        resharded = dict(plain.export_hf_weights())
        plain.close()
        torch.save(
            {"metrics": metrics, "trained": trained, "loaded": loaded, "resharded": resharded},
            f"{out}.{rank}",
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_cleanly()


def test_automodel_worker_at_ep2_trains_exports_and_checkpoints_as_one_process(tmp_path):
    from tests.core.parallel_harness import make_batch, reference_training
    from tests.recipe_builder import tiny_automodel_recipe

    model_path = build_tiny_moe(tmp_path / "moe")
    out = tmp_path / "result"
    mp.start_processes(
        _worker_rank, args=(2, _free_port(), model_path, str(out)), nprocs=2, start_method="fork"
    )
    _, want = reference_training(
        model_path, tiny_automodel_recipe(lr=5e-3), [make_batch(seed=5, vocab=64)]
    )
    from transformers import AutoModelForCausalLM

    exported = checkpoint_weights(AutoModelForCausalLM.from_pretrained(f"{out}.hf"))
    assert sorted(exported) == sorted(want)
    for name, tensor in want.items():
        torch.testing.assert_close(exported[name], tensor, atol=2e-5, rtol=1e-5)
    for rank in range(2):
        result = torch.load(f"{out}.{rank}", weights_only=False)
        assert sorted(result["trained"]) == sorted(want)
        for name, tensor in want.items():
            torch.testing.assert_close(result["trained"][name], tensor, atol=2e-5, rtol=1e-5)
            assert torch.equal(result["loaded"][name], result["trained"][name]), name
            assert torch.equal(result["resharded"][name], result["trained"][name]), name


def test_ignore_router_for_ac_keeps_the_router_projection_from_the_forward(tmp_path):
    """NeMo Automodel's ignore_router_for_ac under activation checkpointing: the recompute in
    backward takes each MoE router's projection from the forward pass (counted as it reaches
    the dispatcher: once per layer, not twice), and the gradients stay those of no
    checkpointing."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.expert_parallel import moe_blocks, router_saving_context
    from hpcrl.core.backends.automodel.parallelize import apply_activation_checkpointing

    path = build_tiny_moe(tmp_path / "moe")
    ids = rank_batches(0, 1)[0]

    class RouterMatmuls(TorchDispatchMode):
        def __init__(self, shape: tuple[int, ...]) -> None:
            super().__init__()
            self.shape, self.count = shape, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default and tuple(args[1].shape) == self.shape:
                self.count += 1
            return func(*args, **(kwargs or {}))

    def run(mode: str) -> tuple[int, list[torch.Tensor]]:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        (hidden, experts) = moe_blocks(model)[0].gate.weight.shape[::-1]
        if mode != "none":
            saving = router_saving_context(model) if mode == "save" else None
            apply_activation_checkpointing(model, saving)
        counter = RouterMatmuls((hidden, experts))
        with counter:
            nll(model, ids).backward()
        return counter.count, [p.grad.clone() for p in model.parameters()]

    plain_count, plain_grads = run("none")
    recompute_count, _ = run("recompute")
    saved_count, saved_grads = run("save")
    layers = 2
    # forward: one router matmul per layer; the gate's weight gradient and the gradient to
    # its input are two more matmuls of other shapes, not counted
    assert plain_count == layers
    assert recompute_count == 2 * layers  # the whole block, router included, runs again
    assert saved_count == layers  # the router's projection is taken from the forward
    for got, want in zip(saved_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
