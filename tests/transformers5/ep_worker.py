"""Expert parallelism through the Automodel worker itself (the backend's own loading code,
``load_hf_model``, multimodal wrappers included) over 2 forked gloo ranks, against one
process of the same model: log-probs, one train step (loss, gradient norm) and the weights it
leaves, in the checkpoint's names. Shared by the transformers-5 MoE families' tests."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.core.parallel_harness import make_batch, masked_nll_loss
from tests.core.test_expert_parallel import _exit_cleanly, _free_port
from tests.core.test_multimodal_text_models import wrapper_logprobs

WORLD = 2
ROWS = 4  # per rank: two micro-batches of 2
LR = 5e-3


def recipe_for(model_path: str, ep: int, checkpointing: bool = False) -> Any:
    """``checkpointing``: activation checkpointing, as NeMo RL's EP recipes of these models
    set it (each block recomputed in backward: its token exchange runs again)."""
    from tests.recipe_builder import tiny_automodel_recipe, with_automodel, with_policy

    recipe = tiny_automodel_recipe(lr=LR, activation_checkpointing=checkpointing)
    recipe = with_policy(recipe, model_name=model_path)
    return with_automodel(recipe, expert_parallel_size=ep)


def _rank(rank: int, port: int, model_path: str, ep: int, checkpointing: bool, out: str) -> None:
    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        info = RankInfo(rank=rank, world_size=WORLD, local_rank=rank, local_world_size=WORLD,
                        node_rank=0, master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
        worker = AutomodelWorker()
        worker.setup(recipe_for(model_path, ep, checkpointing), info, model_path)
        batch = make_batch(seed=5)
        rows = {key: value[rank * ROWS : (rank + 1) * ROWS] for key, value in batch.items()}
        logprobs = worker.logprobs(rows)
        micro = [{key: value[i : i + 2] for key, value in rows.items()} for i in (0, 2)]
        metrics = worker.train_step(micro, masked_nll_loss, float(batch["token_mask"].sum()))
        trained = dict(worker.export_hf_weights())
        worker.close()
        torch.save({"logprobs": logprobs, "metrics": metrics, "trained": trained}, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_cleanly()


def worker_ranks(model_path: str, ep: int, out: str, checkpointing: bool) -> list[dict[str, Any]]:
    """Each rank's log-probs of its rows, its train-step metrics and its refit weights."""
    args = (_free_port(), model_path, ep, checkpointing, out)
    mp.start_processes(_rank, args=args, nprocs=WORLD, start_method="fork")
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(WORLD)]


def one_process(model_path: str) -> dict[str, Any]:
    """The same batch in one process: the model as the backend loads it, a plain forward,
    ``clip_grad_norm_`` and AdamW; weights in the checkpoint's names."""
    from hpcrl.core.backends.automodel.expert_layout import checkpoint_named_tensors
    from hpcrl.core.backends.automodel.model import load_hf_model

    recipe = recipe_for(model_path, 1)
    model = load_hf_model(model_path, "cpu")
    batch = make_batch(seed=5)
    with torch.no_grad():
        logprobs = wrapper_logprobs(model_path, batch, model.eval())
    model.train()
    params = [param for param in model.parameters() if param.requires_grad]
    cfg = recipe.policy.optimizer
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    tokens = float(batch["token_mask"].sum())
    loss, _ = masked_nll_loss(wrapper_logprobs(model_path, batch, model), batch, tokens)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, recipe.policy.max_grad_norm)
    optimizer.step()
    state = [(name, tensor.detach().clone()) for name, tensor in model.state_dict().items()]
    return {
        "logprobs": logprobs,
        "mask": batch["attention_mask"].bool(),
        "loss": float(loss.detach()),
        "grad_norm": float(norm),
        "weights": dict(checkpoint_named_tensors(model, state)),
    }


def assert_ep_matches_one_process(
    model_path: str, out: str, checkpoint: dict, checkpointing: bool, ep: int = WORLD
) -> None:
    """EP over 2 ranks (``ep`` 1: FSDP alone over them) equals one process; its refits carry
    the checkpoint file's names."""
    want = one_process(model_path)
    for rank, got in enumerate(worker_ranks(model_path, ep, out, checkpointing)):
        rows = slice(rank * ROWS, (rank + 1) * ROWS)
        mask = want["mask"][rows]
        torch.testing.assert_close(
            got["logprobs"][mask], want["logprobs"][rows][mask], atol=1e-5, rtol=0
        )
        assert abs(got["metrics"]["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"])
        assert abs(got["metrics"]["grad_norm"] - want["grad_norm"]) <= 1e-5 * want["grad_norm"]
        trained = got["trained"]
        # a tied output embedding is refitted by name too, though the file holds it once
        assert set(checkpoint) <= set(trained) <= set(checkpoint) | {"lm_head.weight"}
        for name, saved in checkpoint.items():
            assert trained[name].shape == saved.shape, name
            # AdamW normalises each update (~LR per element): a wrong expert moves it by ~LR
            torch.testing.assert_close(trained[name], want["weights"][name], atol=1e-4, rtol=1e-5)
