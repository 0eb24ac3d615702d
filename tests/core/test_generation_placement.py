"""The driver places separate vLLM generation workers where the planner put them: the plan's
``generation`` reaches the job through jobspec.json (the typed ``JobSpec``) and becomes the
engines' layout and nodes, with nothing re-decided in the job."""

from __future__ import annotations

import pytest

from tests.require import require_module

require_module("ray")

from hpcrl.config.recipe import (  # noqa: E402
    ColocatedCfg,
    GenerationCfg,
    GenerationResourcesCfg,
    VllmCfg,
)
from hpcrl.core.workers import vllm_workers  # noqa: E402
from hpcrl.plan.planner import plan  # noqa: E402
from hpcrl.run.jobspec_file import read_jobspec, write_jobspec  # noqa: E402
from tests.plan.planning_inputs import pyxis_profile  # noqa: E402
from tests.recipe_builder import automodel_recipe, with_policy  # noqa: E402

NODES = ["driver-node", "node-b", "node-c", "node-d"]  # the training group's node order


@pytest.fixture
def four_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcrl.core.workers.group as group

    monkeypatch.setattr(group, "pick_nodes", lambda count: NODES[:count])


def _planned_layout(
    tmp_path, num_nodes: int, generation_per_node: int, tp: int = 1, generation_nodes: int = 1
) -> vllm_workers.GenerationLayout:
    """``num_nodes`` × 8 GPUs in all (cluster.*, NeMo RL's meaning): on one node generation
    takes ``generation_per_node`` of them, on more the last node."""
    generation = GenerationCfg(
        backend="vllm",
        vllm_cfg=VllmCfg(tensor_parallel_size=tp),
        colocated=ColocatedCfg(
            enabled=False,
            resources=GenerationResourcesCfg(
                num_nodes=generation_nodes, gpus_per_node=generation_per_node
            ),
        ),
    )
    recipe = with_policy(automodel_recipe(num_nodes, 8), generation=generation)
    spec = plan(recipe, pyxis_profile(), run_dir=str(tmp_path), recipe_source="grpo-test")
    write_jobspec(spec)
    placement = read_jobspec(tmp_path).generation
    assert placement == spec.generation
    return vllm_workers.generation_layout(placement, "cuda")


def test_own_nodes_follow_the_training_nodes(tmp_path, four_nodes) -> None:
    layout = _planned_layout(tmp_path, num_nodes=3, generation_per_node=8, tp=2)
    assert (layout.first_node, layout.num_nodes) == (2, 1)
    assert (layout.engines_per_node, layout.gpus_per_engine) == (4, 2)
    assert vllm_workers.generation_node_ids(layout.first_node, layout.num_nodes) == ["node-c"]


def test_an_engine_larger_than_a_node_takes_an_actor_per_node(tmp_path, four_nodes) -> None:
    # 4 × 8 GPUs: training on nodes 0-1, one tp 16 engine over generation nodes 2-3.
    layout = _planned_layout(tmp_path, 4, 8, tp=16, generation_nodes=2)
    assert (layout.first_node, layout.num_nodes, layout.nodes_per_engine) == (2, 2, 2)
    # one engine; each of its nodes' actors holds the node's 8 GPUs
    assert (layout.num_engines, layout.engines_per_node, layout.gpus_per_engine) == (1, 1, 8)
    assert vllm_workers.generation_node_ids(2, 2) == ["node-c", "node-d"]


def test_a_one_node_split_shares_the_driver_node(tmp_path, four_nodes) -> None:
    layout = _planned_layout(tmp_path, num_nodes=1, generation_per_node=4)
    assert (layout.first_node, layout.engines_per_node, layout.gpus_per_engine) == (0, 4, 1)
    assert vllm_workers.generation_node_ids(layout.first_node, 1) == ["driver-node"]


def test_cpu_engines_take_one_worker_slot_each() -> None:
    from hpcrl.run.jobspec import GenerationPlacement

    placement = GenerationPlacement(
        first_node=0, num_nodes=1, slots_per_node=1, num_engines=1, slots_per_engine=1,
        training_nodes=1, training_slots_per_node=1,
    )  # fmt: skip
    layout = vllm_workers.generation_layout(placement, "cpu")
    assert (layout.engines_per_node, layout.gpus_per_engine, layout.num_engines) == (1, 0, 1)
