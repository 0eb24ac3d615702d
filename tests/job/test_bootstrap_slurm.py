"""Per-node Ray bootstrap on the real 2-node test Slurm cluster, without submitit.

``two_node_probe.sbatch`` runs ``hpcrl.job.node.main`` once per node through srun; the probe
driver runs a Ray task pinned to each node. (The submitit path is tested in tests/submit.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.job.plans import write_node_plan
from tests.slurm.harness import (
    NETNS_NODE_IPS,
    cluster_mode,
    run_slurm,
    sacct_exit_codes,
    wait_sacct_states,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("two_node_probe.sbatch")


def run_probe_job(run_dir: Path, **env: str) -> str:
    """Plan a 2-node job into ``run_dir``, submit the probe script, wait until it left the
    queue, return the job id."""
    write_node_plan(run_dir, num_nodes=2)
    job_id = run_slurm(
        "sbatch", "--parsable", f"--chdir={REPO_ROOT}", f"--output={run_dir}/slurm-%j.out",
        "--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items()) if env else "--export=ALL",
        str(SCRIPT), str(run_dir), sys.executable,
    ).strip()  # fmt: skip
    deadline = time.monotonic() + 240
    while run_slurm("squeue", "-h", "-j", job_id, check=False).strip():
        assert time.monotonic() < deadline, f"job {job_id} still queued/running after 240 s"
        time.sleep(0.3)
    return job_id


def ray_processes_of(job_id: str) -> list[str]:
    marker = f"hpcrl-ray-{job_id}-"
    return [
        f"{p.pid} {' '.join(p.info['cmdline'] or [])[:100]}"
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or [])
    ]


def test_two_slurm_nodes_form_one_ray_cluster_and_run_work_on_each(tmp_path):
    job_id = run_probe_job(tmp_path)

    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    wait_sacct_states(job_id, ["COMPLETED"])
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["problems"] == [], output
    assert probe["num_alive_nodes"] == 2
    tasks = probe["tasks"]
    assert [(task["rank"], task["value"]) for task in tasks] == [(0, 0), (1, 1)]
    assert [task["hostname"] for task in tasks] == ["n1", "n2"]
    if cluster_mode() == "netns":
        assert [task["node_ip"] for task in tasks] == [NETNS_NODE_IPS["n1"], NETNS_NODE_IPS["n2"]]
        assert probe["alive_node_ips"] == sorted(NETNS_NODE_IPS.values())
    ready = json.loads((tmp_path / "status" / "ray_ready").read_text())
    assert (ready["attempt"], ready["node_names"]) == (f"{job_id}.0", ["n1", "n2"])
    for rank, name in enumerate(["n1", "n2"]):
        node_log = (tmp_path / "logs" / f"node{rank}" / "attempt0" / "node.log").read_text()
        assert f"node {rank} of 2 ({name}, " in node_log
        assert "Ray stopped" in node_log
    assert ray_processes_of(job_id) == []


def test_failing_driver_fails_the_slurm_job_with_its_exit_code(tmp_path):
    job_id = run_probe_job(tmp_path, HPCRL_DRIVER="tests.job.drivers:exit_with_7")

    wait_sacct_states(job_id, ["FAILED"])
    assert sacct_exit_codes(job_id) == ["7:0"]
    assert json.loads((tmp_path / "status" / "done").read_text())["exit_code"] == 7
    assert ray_processes_of(job_id) == []
