"""The driver places separate vLLM generation workers where the planner put them: the plan's
``generation.first_node`` reaches the job through jobspec.json and selects the nodes."""

from __future__ import annotations

import pytest

from tests.require import require_module

require_module("ray")

from hpcrl.config.recipe import ColocatedCfg, GenerationCfg, GenerationResourcesCfg  # noqa: E402
from hpcrl.core.driver import planned_generation_node  # noqa: E402
from hpcrl.core.generation import vllm_workers  # noqa: E402
from hpcrl.plan.planner import plan  # noqa: E402
from hpcrl.submit.submission import write_jobspec  # noqa: E402
from tests.plan.planning_inputs import automodel_recipe, pyxis_profile, with_policy  # noqa: E402

NODES = ["driver-node", "node-b", "node-c", "node-d"]  # the training group's node order


@pytest.fixture
def four_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcrl.core.workers.group as group

    monkeypatch.setattr(group, "pick_nodes", lambda count: NODES[:count])


def _planned_first_node(tmp_path, training_per_node: int, generation_per_node: int) -> int | None:
    generation = GenerationCfg(
        backend="vllm",
        colocated=ColocatedCfg(
            enabled=False,
            resources=GenerationResourcesCfg(num_nodes=1, gpus_per_node=generation_per_node),
        ),
    )
    recipe = with_policy(automodel_recipe(2, training_per_node), generation=generation)
    spec = plan(recipe, pyxis_profile(), run_dir=str(tmp_path), recipe_source="grpo-test")
    write_jobspec(spec)
    return planned_generation_node(tmp_path)


def test_own_nodes_follow_the_training_nodes(tmp_path, four_nodes) -> None:
    first = _planned_first_node(tmp_path, training_per_node=8, generation_per_node=8)
    assert first == 2
    assert vllm_workers.generation_node_ids(2, 1, first) == ["node-c"]


def test_shared_nodes_are_the_first_training_nodes(tmp_path, four_nodes) -> None:
    first = _planned_first_node(tmp_path, training_per_node=4, generation_per_node=4)
    assert first == 0
    assert vllm_workers.generation_node_ids(2, 1, first) == ["driver-node"]


def test_no_plan_means_no_planned_node(tmp_path) -> None:
    assert planned_generation_node(tmp_path) is None
