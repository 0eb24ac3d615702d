"""A vLLM engine of tensor_parallel_size 2 as a colocated engine group builds it
(``hpcrl.core.workers.engine_group``: vLLM's own worker processes, each bound to the cores of
one rank of the group through ``VLLM_CPU_OMP_THREADS_BIND``): it samples what a TP=1 engine
samples on the same weights, and after a refit what a fresh engine built from the new
weights samples."""

from __future__ import annotations

import os

import attrs
import pytest
import torch

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.engine_devices import EngineDevices
from hpcrl.core.generation.vllm_engine import VllmEngine
from hpcrl.core.workers.engine_group import EngineGroup, cpu_engine_devices
from tests.vllm.harness import (
    VLLM_CFG,
    assert_logprobs_close,
    build_tiny_model,
    encode,
    responses,
    vllm_spec,
    wait_until_gone,
)

GREEDY = GenerationCfg(temperature=0.0, max_new_tokens=16)
SAMPLED = GenerationCfg(temperature=1.0, max_new_tokens=16)
TP2 = attrs.evolve(VLLM_CFG, tensor_parallel_size=2)
# fp32 on both sides; TP=2 sums its row-parallel matmuls in another order (all-reduce).
LOGPROB_TOLERANCE = 1e-4


def _group_devices() -> EngineDevices:
    """The devices the leader of a 2-rank group on a 2-rank node gets (this box: 2 cores)."""
    return cpu_engine_devices(EngineGroup(rank=0, ranks_per_engine=2), 0, 2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(path)


def _children() -> set[int]:
    import psutil

    # Python's multiprocessing resource tracker (one per parent, exits with it) aside, and
    # what has ended (a zombie an earlier test left unreaped has no command line to read).
    children = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                children.add(child.pid)
        except psutil.Error:
            continue
    return children


def test_group_devices_bind_one_rank_of_cores_per_engine_process() -> None:
    cores = sorted(os.sched_getaffinity(0))
    binding = _group_devices().env["VLLM_CPU_OMP_THREADS_BIND"]
    half = len(cores) // 2
    assert binding == (
        ",".join(map(str, cores[:half])) + "|" + ",".join(map(str, cores[half : 2 * half]))
    )


@pytest.mark.slow
def test_tp2_engine_samples_as_tp1_and_follows_a_refit(tiny, tmp_path) -> None:
    """One TP=2 engine (slow: three engine starts, ~1 min on 2 cores)."""
    path, model, tokenizer = tiny
    prompts = encode(tokenizer)
    before = set(_children())
    tp1 = VllmEngine(vllm_spec(path))
    try:
        reference = tp1.generate(prompts, GREEDY, seed=0)
        reference_sampled = tp1.generate(prompts, SAMPLED, seed=3)
    finally:
        tp1.shutdown()
    tp2 = VllmEngine(vllm_spec(path, TP2), devices=_group_devices())
    engine_pids = sorted(_children() - before)
    try:
        greedy = tp2.generate(prompts, GREEDY, seed=0)
        sampled = tp2.generate(prompts, SAMPLED, seed=3)
        new_weights = _perturbed(model)
        tp2.update_weights(new_weights.items())
        refitted = tp2.generate(prompts, GREEDY, seed=0)
    finally:
        tp2.shutdown()
    # TP=2 ran as vLLM worker processes of its own (engine core + 2 workers), all gone now.
    assert len(engine_pids) >= 3, engine_pids
    assert wait_until_gone(engine_pids) == []

    assert responses(greedy) == responses(reference)
    assert_logprobs_close(greedy, reference, LOGPROB_TOLERANCE)
    # Seeded sampling draws the same tokens from the same distribution.
    assert responses(sampled) == responses(reference_sampled)
    assert_logprobs_close(sampled, reference_sampled, LOGPROB_TOLERANCE)

    # Parity after the refit: a fresh engine built from the new weights.
    fresh_path = tmp_path / "refitted"
    original = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(new_weights)
    try:
        model.save_pretrained(fresh_path, safe_serialization=True)
    finally:
        model.load_state_dict(original)
    tokenizer.save_pretrained(fresh_path)
    fresh = VllmEngine(vllm_spec(str(fresh_path)))
    try:
        expected = fresh.generate(prompts, GREEDY, seed=0)
    finally:
        fresh.shutdown()
    changed = sum(a != b for a, b in zip(responses(greedy), responses(refitted), strict=True))
    assert changed >= 12, f"only {changed}/16 greedy outputs changed with new weights"
    assert responses(refitted) == responses(expected)
    assert_logprobs_close(refitted, expected, LOGPROB_TOLERANCE)


def _perturbed(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight scaled and shifted by a fixed pattern (a stand-in for a training step)."""
    gen = torch.Generator().manual_seed(7)
    return {
        name: tensor * 1.5 + 0.05 * torch.randn(tensor.shape, generator=gen)
        for name, tensor in model.state_dict().items()
    }
