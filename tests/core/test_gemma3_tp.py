"""Tensor parallelism for Gemma 3 on the Automodel backend (NeMo RL's gemma-3-27b-it recipes
at dtensor tensor_parallel_size 4 and 8, activation checkpointing on): the multimodal
wrapper (``gemma3``, what gemma-3-27b-it is) and its text decoder alone (``gemma3_text``,
with sequence parallelism), tiny random checkpoints with tied embeddings and sliding-window
and global layers; and Qwen 3, whose q_norm/k_norm are per head like Gemma 3's.

The Automodel worker itself (the real loading code) runs at TP 2 on forked gloo ranks
(the wrapper at TP 2 x FSDP 2 over 4, as the recipes combine them) with activation
checkpointing: its log-probs equal one process's, and one AdamW step gives that process's
loss, gradient norm and updated weights, on every rank alike (and, at TP 2 x FSDP 2, after
a checkpoint is saved and loaded). The reference is plain transformers: the whole model's
forward, ``clip_grad_norm_`` and AdamW. Blocks run eager: torch.compile with dynamic sizes
of any TP block (with or without the q_norm/k_norm plan) recurses without end in AOT
tracing under this CPU environment's torch 2.13; it traces under torch 2.11 on CUDA.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hpcrl.core.backends.automodel.multimodal import saved_key_names
from tests.core.parallel_harness import make_batch, masked_nll_loss
from tests.core.test_expert_parallel import _exit_cleanly, _free_port
from tests.core.test_multimodal_text_models import CONFIGS, build_tiny, wrapper_logprobs
from tests.core.test_multimodal_text_models import TEXT as BASE

LR = 1e-2
#: the decoders on their own: Gemma 3's is the wrapper's, with its tied embeddings; Qwen 3's
#: has the same per-head q_norm/k_norm
TEXT = {"gemma3_text": CONFIGS["gemma3"]["text_config"], "qwen3": BASE}


def build(folder: Path, model_type: str) -> str:
    """A tiny random checkpoint: the wrapper as transformers saves it, or its text decoder."""
    if model_type == "gemma3":
        return build_tiny(folder, model_type)
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpcrl.core.models.tiny import build_char_tokenizer

    config = AutoConfig.for_model(model_type, **TEXT[model_type])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return str(folder)


def _run_rank(
    rank: int, world: int, port: int, model_path: str, sequence_parallel: bool, out: str
) -> None:
    """One rank (TP 2; FSDP over the data-parallel ranks when ``world`` is 4): log-probs of
    the batch, then one train step on its data-parallel share of the rows (micro-batches of
    2); writes them, the shape of its q_proj shard and the weights it hands to vLLM after
    the step (gathered from the shards, in the checkpoint's names); at world 4, those of a
    fresh worker that loads the checkpoint it saved too."""
    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from tests.recipe_builder import tiny_automodel_recipe, with_automodel, with_policy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        recipe = tiny_automodel_recipe(tp=2, lr=LR, activation_checkpointing=True)
        recipe = with_automodel(recipe, sequence_parallel=sequence_parallel)
        recipe = with_policy(recipe, model_name=model_path)
        info = RankInfo(rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                        node_rank=0, master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
        worker = AutomodelWorker()
        place = worker.setup(recipe, info, model_path)
        layer = worker.model.hf.get_decoder().layers[0]
        q_proj = getattr(layer, "_checkpoint_wrapped_module", layer).self_attn.q_proj.weight
        batch = make_batch(seed=3, seq_len=15)  # odd: SP pads it to a multiple of TP
        logprobs = worker.logprobs(batch)
        share = 8 // place.dp_size
        rows = range(place.dp_rank * share, (place.dp_rank + 1) * share, 2)
        micro = [{key: value[i : i + 2] for key, value in batch.items()} for i in rows]
        metrics = worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))
        result = {
            "q_shard": tuple(q_proj.to_local().shape),
            "logprobs": logprobs,
            "metrics": metrics,
            "weights": dict(worker.export_hf_weights()),  # what vLLM is refitted with
        }
        if world == 4:
            worker.save_checkpoint(f"{out}.ckpt")
        worker.close()
        if world == 4:  # the checkpoint, loaded by a fresh worker of this layout
            resumed = AutomodelWorker()
            resumed.setup(recipe, info, model_path)
            resumed.load_checkpoint(f"{out}.ckpt")
            result["resumed"] = dict(resumed.export_hf_weights())
            resumed.close()
        torch.save(result, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_cleanly()


def reference_step(model_path: str) -> tuple[torch.Tensor, float, float, dict[str, torch.Tensor]]:
    """One process: log-probs, loss, gradient norm and the weights after one AdamW step of
    the whole model (a wrapper's vision part frozen, as the backend freezes it), under the
    names the checkpoint stores them by."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from hpcrl.core.backends.automodel.multimodal import in_checkpoint_layout
    from tests.recipe_builder import tiny_automodel_recipe

    wrapper = AutoConfig.from_pretrained(model_path).model_type == "gemma3"
    auto = AutoModelForImageTextToText if wrapper else AutoModelForCausalLM
    model = auto.from_pretrained(model_path, dtype=torch.float32)
    for name, param in model.named_parameters():
        param.requires_grad_("vision_tower" not in name and "multi_modal_projector" not in name)
    trained = [p for p in model.parameters() if p.requires_grad]
    cfg = tiny_automodel_recipe(lr=LR).policy
    assert cfg.optimizer is not None
    optimizer = torch.optim.AdamW(trained, lr=LR, weight_decay=cfg.optimizer.weight_decay)
    batch = make_batch(seed=3, seq_len=15)
    model.eval()
    with torch.no_grad():
        logprobs = wrapper_logprobs(model_path, batch, model)
    model.train()
    loss, _ = masked_nll_loss(
        wrapper_logprobs(model_path, batch, model), batch, float(batch["token_mask"].sum())
    )
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(trained, cfg.max_grad_norm)
    optimizer.step()
    # the checkpoint's names, as refit gives them (tests/core/test_multimodal_text_models.py)
    named = [(name, tensor.detach().clone()) for name, tensor in model.state_dict().items()]
    weights = dict(in_checkpoint_layout(model, named, saved_key_names(model_path)))
    return logprobs, float(loss.detach()), float(norm), weights


@pytest.mark.parametrize(
    ("model_type", "world", "sequence_parallel"),
    [
        ("gemma3", 4, False),  # NeMo RL's fsdp2tpN shape: TP 2 x FSDP 2
        ("gemma3_text", 2, True),
        ("qwen3", 2, False),
    ],
)
def test_tp2_worker_matches_one_process_in_logprobs_loss_norm_and_weights(
    tmp_path, model_type, world, sequence_parallel
):
    path = build(tmp_path / model_type, model_type)
    out = tmp_path / "result"
    mp.start_processes(
        _run_rank, args=(world, _free_port(), path, sequence_parallel, str(out)), nprocs=world,
        start_method="fork",
    )  # fmt: skip
    results = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(world)]
    want_logprobs, want_loss, want_norm, want_weights = reference_step(path)

    # 4 heads of 8: each rank runs 2 of them (q_proj split by rows)
    assert [r["q_shard"] for r in results] == [(16 // (world // 2), 32)] * world
    batch = make_batch(seed=3, seq_len=15)
    mask = batch["attention_mask"].bool()
    for result in results:
        torch.testing.assert_close(result["logprobs"][mask], want_logprobs[mask], atol=1e-5, rtol=0)
        assert result["metrics"]["loss"] == pytest.approx(want_loss, rel=1e-5)
        assert result["metrics"]["grad_norm"] == pytest.approx(want_norm, rel=1e-5)
        got = result["weights"]
        assert sorted(got) == sorted(want_weights)
        assert saved_key_names(path) <= set(got)  # every checkpoint tensor, by its own name
        # AdamW's first step moves each weight by about LR whatever its gradient's size: an
        # element of near-zero gradient turns summation order into a difference (5e-5 seen
        # on 1 of 1536); a wrong shard or an unreduced gradient moves elements by ~LR
        for name, tensor in got.items():
            torch.testing.assert_close(
                tensor, want_weights[name], atol=1e-4, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
            )
    # every rank hands on the same weights: TP peers' replicated q_norm/k_norm too (their
    # gradients are summed over the heads of both ranks, not each rank's own)
    # and (the wrapper at TP 2 x FSDP 2) a checkpoint gives them back exactly
    for other in results:
        for name, tensor in results[0]["weights"].items():
            assert torch.equal(tensor, other["weights"][name]), name
            if world == 4:
                assert torch.equal(tensor, other["resumed"][name]), name
