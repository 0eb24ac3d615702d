"""Two jobs' Ray clusters on one machine at once, each on its own job's port band (real Ray)."""

from __future__ import annotations

import json
import time

import pytest

from hpcrl.config.port_bands import NUM_BANDS, band_ports
from tests.job.simulated import SimulatedJob, free_port_bands, processes_of_job, wait_node

pytestmark = pytest.mark.timeout(300)


def test_two_jobs_on_one_node_run_side_by_side_on_their_own_bands(tmp_path):
    # Job ids chosen so that their bands (id % NUM_BANDS) are free on this machine.
    jobs = [
        SimulatedJob(run_dir=tmp_path / f"run{band}", num_nodes=1, port_base=0,
                     job_id=str(1000 * NUM_BANDS + band), own_port_band=True)
        for band in free_port_bands(2)
    ]  # fmt: skip
    for job in jobs:
        job.write_plan()
    started = time.monotonic()
    nodes = [job.start_node(0) for job in jobs]  # both heads start at once
    results = [wait_node(node, started) for node in nodes]

    for job, result in zip(jobs, results, strict=True):
        assert result.exit_code == 0, result.output
        probe = json.loads((job.run_dir / "probe.json").read_text())
        assert (probe["problems"], probe["num_alive_nodes"]) == ([], 1)  # its own cluster only
        gcs_port = band_ports(int(job.job_id) % NUM_BANDS)["gcs_port"]
        driver_log = (job.run_dir / "logs/node0/attempt0/driver.log").read_text()
        assert f"connected to Ray at 127.0.0.1:{gcs_port}" in driver_log
        assert processes_of_job(job) == []
