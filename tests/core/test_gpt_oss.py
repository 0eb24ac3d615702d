"""gpt-oss (NeMo RL's sft-gpt-oss-20b recipes) on the Automodel backend, with real
torch.distributed on CPU: a tiny random gpt-oss built by transformers (fused experts with
interleaved gate/up columns and biases, clamped SwiGLU, attention sinks, a sliding-window
layer beside a full one), saved as a Hugging Face checkpoint.

The backend's own worker over 2 gloo ranks, FSDP2 alone (EP 1) and with expert parallelism
(EP 2: each rank keeps 2 of the 4 experts), equals one process: log-probs (1e-5), then one
SFT step's loss and gradient norm, and the updated weights, which leave the worker (refit
and ``hpcrl export``) under the checkpoint's own names and shapes. With the experts stored
in MXFP4 (``tests/core/mxfp4_checkpoint.py``) and ``policy.dequantize_base_checkpoint``, the
worker trains the dequantized weights as one process trains transformers' own dequantized
model, and exports them unquantized (no quantization_config in the exported config.json).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.core.test_expert_parallel import _exit_cleanly, _free_port

LR = 5e-3


def build_tiny_gpt_oss(folder: Path) -> str:
    """A seeded random gpt-oss decoder (4 experts, top-2) with hpcrl's character tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpcrl.core.models.tiny import build_char_tokenizer

    config = AutoConfig.for_model(
        "gpt_oss", vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # transformers initialises the sinks and biases small or zero
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "_bias", "router.bias")):
                param.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return str(folder)


def saved_tensors(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def one_process(model_path: str, batch: dict, mxfp4: bool) -> dict[str, Any]:
    """Log-probs, then one AdamW step as the backend trains it (per-expert layout), with the
    weights in the checkpoint's names. ``mxfp4``: transformers dequantizes the experts."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    from hpcrl.core.backends.automodel.expert_layout import checkpoint_named_tensors, unfuse_experts
    from hpcrl.core.backends.automodel.model import forget_dequantization
    from tests.core.parallel_harness import masked_nll_loss, reference_logprobs
    from tests.recipe_builder import tiny_automodel_recipe

    recipe = tiny_automodel_recipe(lr=LR)
    dequantized = {"quantization_config": Mxfp4Config(dequantize=True)} if mxfp4 else {}
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, **dequantized)
    model.float()  # the dequantized experts come in bf16
    forget_dequantization(model)  # names as the weights leave: unquantized ones
    unfuse_experts(model)
    initial = [(k, v.detach().clone()) for k, v in model.state_dict().items()]
    cfg = recipe.policy.optimizer
    assert cfg is not None
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    logprobs = reference_logprobs(model, batch)
    loss, _ = masked_nll_loss(logprobs, batch, float(batch["token_mask"].sum()))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.policy.max_grad_norm)
    optimizer.step()
    state = [(k, v.detach().clone()) for k, v in model.state_dict().items()]
    return {
        "logprobs": logprobs.detach(),
        "loss": float(loss.detach()),
        "norm": float(norm),
        "weights": dict(checkpoint_named_tensors(model, state)),
        "initial": dict(checkpoint_named_tensors(model, initial)),
    }


def _worker_rank(
    rank: int, world: int, port: int, model_path: str, ep: int, mxfp4: bool, out: str
) -> None:
    import attrs

    from hpcrl.core.backends.automodel.expert_layout import GptOssExpert
    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from tests.core.parallel_harness import make_batch, masked_nll_loss
    from tests.recipe_builder import tiny_automodel_recipe, with_automodel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        recipe = with_automodel(tiny_automodel_recipe(lr=LR), expert_parallel_size=ep)
        policy = attrs.evolve(
            recipe.policy, model_name=model_path, dequantize_base_checkpoint=mxfp4
        )
        recipe = attrs.evolve(recipe, policy=policy)
        info = RankInfo(rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                        node_rank=0, master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
        worker = AutomodelWorker()
        worker.setup(recipe, info, model_path)
        kept = [  # the experts this rank holds, per MoE layer
            sum(isinstance(e, GptOssExpert) for e in layer.mlp.experts)
            for layer in worker.model.hf.model.layers
        ]
        batch = make_batch(seed=5, vocab=128)
        rows = {key: value[rank * 4 : rank * 4 + 4] for key, value in batch.items()}
        logprobs = worker.logprobs(rows)
        micro = [{key: value[i : i + 2] for key, value in rows.items()} for i in (0, 2)]
        metrics = worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))
        refit = dict(worker.export_hf_weights())
        worker.export_hf(f"{out}.hf")
        worker.save_checkpoint(f"{out}.dcp")  # per expert, as they train
        worker.close()
        torch.save(
            {"logprobs": logprobs, "metrics": metrics, "refit": refit, "kept": kept},
            f"{out}.{rank}",
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_cleanly()


@pytest.mark.parametrize(("ep", "mxfp4"), [(1, False), (2, False), (2, True)])
def test_gpt_oss_over_two_ranks_equals_one_process(tmp_path, ep, mxfp4):
    check_two_ranks_equal_one_process(tmp_path, ep, mxfp4)


def check_two_ranks_equal_one_process(tmp_path: Path, ep: int, mxfp4: bool) -> None:
    """Also run under transformers 5 (tests/transformers5/test_gpt_oss.py)."""
    from tests.core.mxfp4_checkpoint import write_mxfp4_checkpoint
    from tests.core.parallel_harness import make_batch

    model_path = build_tiny_gpt_oss(tmp_path / "gpt-oss")
    saved = saved_tensors(model_path)  # the unquantized checkpoint's names and shapes
    if mxfp4:
        write_mxfp4_checkpoint(model_path, tmp_path / "mxfp4")
        model_path = str(tmp_path / "mxfp4")
    out = tmp_path / "result"
    mp.start_processes(
        _worker_rank, args=(2, _free_port(), model_path, ep, mxfp4, str(out)), nprocs=2,
        start_method="fork",
    )  # fmt: skip
    batch = make_batch(seed=5, vocab=128)
    want = one_process(model_path, batch, mxfp4)
    exported = saved_tensors(f"{out}.hf")
    # hpcrl export of the DCP checkpoint: the same tensors, fused as the checkpoint fuses them
    from hpcrl.core.backends.automodel.export import export_dcp_to_hf

    export_dcp_to_hf(f"{out}.dcp", tmp_path / "from_dcp", model_path, model_path)
    from_dcp = saved_tensors(str(tmp_path / "from_dcp"))
    assert sorted(from_dcp) == sorted(exported)
    for name, tensor in exported.items():
        assert torch.equal(from_dcp[name], tensor), name
    for folder in (f"{out}.hf", tmp_path / "from_dcp"):  # the weights are not MXFP4 any more
        assert "quantization_config" not in json.loads((Path(folder) / "config.json").read_text())
    # the checkpoint's names and shapes: fused experts [E, H, 2I] and their biases
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in saved.items()}
    assert sorted(want["weights"]) == sorted(saved)
    moved = 0
    for rank in range(2):
        result = torch.load(f"{out}.{rank}", weights_only=False)
        assert result["kept"] == [4 // ep, 4 // ep]
        mask = batch["attention_mask"][rank * 4 : rank * 4 + 4].bool()
        torch.testing.assert_close(
            result["logprobs"][mask], want["logprobs"][rank * 4 : rank * 4 + 4][mask],
            atol=1e-5, rtol=0,
        )  # fmt: skip
        assert result["metrics"]["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert result["metrics"]["grad_norm"] == pytest.approx(want["norm"], rel=1e-5)
        assert sorted(result["refit"]) == sorted(saved)
        for name, tensor in want["weights"].items():
            torch.testing.assert_close(result["refit"][name], tensor, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(exported[name], tensor, atol=2e-5, rtol=1e-5)
            moved += not torch.equal(tensor, want["initial"][name])
    assert moved >= 0.9 * 2 * len(saved)  # the step moved the weights compared
