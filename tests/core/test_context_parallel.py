"""Context parallelism's pieces (``hpcrl.core.backends.automodel.context_parallel``) with real
torch.distributed on CPU: 2 gloo ranks, one CP group, a tiny Qwen2 built in each process
from the same seed. Against one process over the whole sequences: the same per-token
log-probs (with and without an attention mask; also under a sliding window), and gradients
whose sum over the CP group is CP × the single-process gradient (what FSDP's average over
dp × cp then divides out).

Mutations of the three things CP must get right each change the log-probs: log-probs put
back in rank order instead of sequence order (the chunk order), attention over the rank's
own keys only (no K/V gather), local instead of global positions for the rotary embeddings.
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

CP = 2
SEQ = 24  # a multiple of 2 x CP: 4 chunks of 6
MUTATIONS = ("none", "rank_order", "no_kv_gather", "local_positions")
WINDOW = 5  # a sliding window shorter than a chunk (6) and than the sequence


def test_load_balanced_positions_pair_first_and_last_chunks() -> None:
    from hpcrl.core.backends.automodel.context_parallel import load_balanced_positions

    assert load_balanced_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert load_balanced_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="multiple of 2 x CP = 4"):
        load_balanced_positions(6, 2, 0)


def tiny_model(sliding_window: int | None = None) -> Any:
    """``sliding_window``: every layer attends to that many recent keys only."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    window = {}
    if sliding_window is not None:
        window = dict(use_sliding_window=True, sliding_window=sliding_window, max_window_layers=0)
    config = Qwen2Config(
        **window,
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, attn_implementation="sdpa", initializer_range=0.3,
    )  # fmt: skip
    # Weights larger than HF's default init: attention then matters to every log-prob (at
    # 0.02 the tiny model is near uniform and a rotary bug moves log-probs by only 3e-4).
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows of different lengths."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (3, SEQ), generator=gen)
    lengths = torch.tensor([SEQ, 17, 9])
    mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()
    return torch.where(mask.bool(), ids, 0), mask


def mutate(name: str, monkeypatch: Any, module: Any) -> None:
    """One deliberate bug in ``module`` (the context_parallel module) for this process."""
    if name == "rank_order":
        monkeypatch.setattr(module, "to_sequence_order", lambda gathered, _keys: gathered)
    elif name == "no_kv_gather":
        monkeypatch.setattr(
            module, "gather_keys_values", lambda k, v, cp: (k, v, cp.query_positions)
        )


def run_variant(model: Any, group: Any, mutation: str) -> tuple[torch.Tensor, ...]:
    """(log-probs causal-only, log-probs with mask, loss gradients summed over CP)."""
    from hpcrl.core.backends.automodel import context_parallel as cp_module

    runner = model
    if mutation == "local_positions":

        def runner(*args: Any, position_ids: torch.Tensor, **kwargs: Any) -> Any:
            local = torch.arange(position_ids.shape[1]).expand_as(position_ids)
            return model(*args, position_ids=local, **kwargs)

    ids, mask = batch()
    with pytest.MonkeyPatch.context() as monkeypatch:
        mutate(mutation, monkeypatch, cp_module)
        model.zero_grad()
        causal, _ = cp_module.context_parallel_logprobs(runner, ids, None, group)
        (-(causal * mask).sum()).backward()
        masked = causal
        if mutation == "none":  # the mutations are judged on the causal pass
            masked, _ = cp_module.context_parallel_logprobs(runner, ids, mask, group)
    grads = [p.grad.detach().clone() for p in model.parameters()]
    for grad in grads:
        dist.all_reduce(grad, group=group)
    return causal.detach(), masked.detach(), torch.cat([g.flatten() for g in grads])


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=CP)
    from hpcrl.core.backends.automodel.context_parallel import apply_context_parallel
    from hpcrl.core.backends.automodel.model import TokenLogprobModel

    hf_model = tiny_model()
    apply_context_parallel(hf_model)
    model = TokenLogprobModel(hf_model)
    group = dist.new_group(list(range(CP)))
    results = {name: run_variant(model, group, name) for name in MUTATIONS}
    windowed = TokenLogprobModel(tiny_model(sliding_window=WINDOW))
    apply_context_parallel(windowed.hf)
    results["sliding_window"] = run_variant(windowed, group, "none")
    if rank == 0:
        torch.save(results, Path(out_dir) / "cp.pt")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # training-stack-facts, trap 2: gloo threads may abort a normal exit


def reference(sliding_window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One process, whole sequences, plain SDPA: log-probs and the loss gradient."""
    from hpcrl.core.backends.automodel.model import TokenLogprobModel

    model = TokenLogprobModel(tiny_model(sliding_window))
    ids, mask = batch()
    logprobs, _ = model(ids, None)
    (-(logprobs * mask).sum()).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return logprobs.detach(), grads


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    require_module("transformers")
    out = tmp_path_factory.mktemp("cp")
    mp.start_processes(_worker, args=(free_port(), str(out)), nprocs=CP, start_method="spawn")
    return torch.load(out / "cp.pt")


def test_context_parallel_logprobs_and_gradients_match_one_process(cp_results: dict) -> None:
    ref_logprobs, ref_grads = reference()
    causal, masked, grads = cp_results["none"]
    _, mask = batch()
    torch.testing.assert_close(causal, ref_logprobs, atol=1e-5, rtol=0)
    # With a mask, padding keys are hidden: every real token's log-prob is the same.
    torch.testing.assert_close(masked * mask, ref_logprobs * mask, atol=1e-5, rtol=0)
    torch.testing.assert_close(grads, CP * ref_grads, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mutation", MUTATIONS[1:])
def test_each_context_parallel_mutation_changes_the_logprobs(
    cp_results: dict, mutation: str
) -> None:
    ref_logprobs, _ = reference()
    _, mask = batch()
    causal, _, _ = cp_results[mutation]
    assert float(((causal - ref_logprobs) * mask).abs().max()) > 1e-1


def test_context_parallel_keeps_a_sliding_window(cp_results: dict) -> None:
    ref_logprobs, ref_grads = reference(sliding_window=WINDOW)
    causal, masked, grads = cp_results["sliding_window"]
    _, mask = batch()
    torch.testing.assert_close(causal, ref_logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(masked * mask, ref_logprobs * mask, atol=1e-5, rtol=0)
    torch.testing.assert_close(grads, CP * ref_grads, atol=1e-4, rtol=1e-4)
    # The window changes what the model computes: the test would see a lost window.
    assert float(((ref_logprobs - reference()[0]) * mask).abs().max()) > 1e-1
