"""A small driver that checks the job's Ray cluster: ``HPCRL_DRIVER=hpcrl.job.probe:run_probe``.

It runs one Ray task pinned to each node (through the node's ``hpcrl_node_<rank>`` resource)
and writes what each task saw into ``<run_dir>/probe.json``. It fails (exit code 1) when Ray
lists another number of alive nodes than the job has, or when a task did not run on the node it
was pinned to. Used by the bootstrap tests and for checking a new cluster profile by hand.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from hpcrl.job.ray_cluster import node_resource_name
from hpcrl.job.settings import read_node_settings

PROBE_FILE = "probe.json"


def _where_am_i(rank: int) -> dict[str, object]:
    import ray

    context = ray.get_runtime_context()
    return {
        "rank": rank,
        "hostname": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": context.get_node_id(),
        "pid": os.getpid(),
        "value": rank * rank,  # work whose result the caller can check
    }


def run_probe(run_dir: str) -> int:
    """Check every node runs work; returns 0 when all is as expected, 1 otherwise."""
    import ray

    settings = read_node_settings(run_dir, os.environ)
    alive = [node for node in ray.nodes() if node["Alive"]]
    where = ray.remote(num_cpus=0)(_where_am_i)
    futures = [
        where.options(resources={node_resource_name(rank): 0.001}).remote(rank)
        for rank in range(settings.num_nodes)
    ]
    results = ray.get(futures, timeout=120)
    node_of_rank = {
        rank: node["NodeID"]
        for node in alive
        for rank in range(settings.num_nodes)
        if node["Resources"].get(node_resource_name(rank))
    }
    problems = []
    if len(alive) != settings.num_nodes:
        problems.append(f"{len(alive)} alive Ray nodes, expected {settings.num_nodes}")
    for result in results:
        if result["node_id"] != node_of_rank.get(result["rank"]):
            problems.append(f"task for node {result['rank']} ran on node {result['node_id']}")
        if result["value"] != result["rank"] ** 2:
            problems.append(f"task for node {result['rank']} returned {result['value']}")
    report = {
        "num_alive_nodes": len(alive),
        "alive_node_ips": sorted(node["NodeManagerAddress"] for node in alive),
        "tasks": results,
        "problems": problems,
    }
    Path(run_dir, PROBE_FILE).write_text(json.dumps(report, indent=2))
    for problem in problems:
        print(f"probe: {problem}", flush=True)
    return 1 if problems else 0
