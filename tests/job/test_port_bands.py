"""Per-job Ray port bands: disjoint between jobs, equal on every node of a job, overridable."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config.port_bands import NUM_BANDS, band_ports, job_key
from hpcrl.config.profile import RayPortsCfg
from hpcrl.job.errors import NodeSettingsError
from hpcrl.job.settings import read_node_settings
from tests.job.plans import write_node_plan


@pytest.fixture
def two_node_plan(tmp_path):
    """A 2-node plan whose profile names no Ray port: every port comes from the band."""
    return write_node_plan(tmp_path, num_nodes=2)


def slurm_env(job_id: str, rank: int, **extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": job_id, "SLURM_NODEID": str(rank), "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "localhost,localhost", "SLURMD_NODENAME": "localhost", **extra,
    }  # fmt: skip


def port_set(ports: dict[str, int]) -> set[int]:
    """Every port a job binds: the single ports and the whole worker range."""
    singles = {port for name, port in ports.items() if not name.endswith("_worker_port")}
    workers = set(range(ports["min_worker_port"], ports["max_worker_port"] + 1))
    assert not singles & workers
    return singles | workers


def test_every_band_is_disjoint_from_every_other_and_below_the_ephemeral_range():
    sets = [port_set(band_ports(band)) for band in range(NUM_BANDS)]
    assert len(set().union(*sets)) == sum(len(ports) for ports in sets) == NUM_BANDS * 506
    assert min(min(ports) for ports in sets) == 10000
    assert max(max(ports) for ports in sets) == 32527 < 32768
    with pytest.raises(ValueError, match="port band 44 is not in 0..43"):
        band_ports(NUM_BANDS)


def test_two_jobs_on_one_node_get_disjoint_ports(tmp_path, two_node_plan):
    first = read_node_settings(tmp_path, slurm_env("4242", 0)).ray_ports
    second = read_node_settings(tmp_path, slurm_env("4243", 0)).ray_ports

    assert (first.gcs_port, second.gcs_port) == (19216, 19728)
    assert not port_set(attrs.asdict(first)) & port_set(attrs.asdict(second))


def test_every_node_of_a_job_and_every_attempt_get_the_same_ports(tmp_path, two_node_plan):
    head = read_node_settings(tmp_path, slurm_env("977001", 0)).ray_ports
    worker = read_node_settings(tmp_path, slurm_env("977001", 1)).ray_ports
    requeued = read_node_settings(tmp_path, slurm_env("977001", 1, SLURM_RESTART_COUNT="1"))
    assert head == worker == requeued.ray_ports


def test_tasks_of_one_array_get_neighbouring_bands(tmp_path, two_node_plan):
    # Array tasks' own job ids need not be consecutive; the array id plus the task id are.
    bands = [
        read_node_settings(
            tmp_path,
            slurm_env(job_id, 0, SLURM_ARRAY_JOB_ID="500", SLURM_ARRAY_TASK_ID=str(task)),
        ).ray_ports.gcs_port
        for task, job_id in enumerate(["500", "588", "589", "632"])  # 588 % 44 == 500 % 44
    ]
    start = 10000 + (500 % NUM_BANDS) * 512
    assert bands == [start, start + 512, start + 1024, start + 1536]


def test_local_runs_take_the_band_of_their_run_id(tmp_path):
    write_node_plan(tmp_path, num_nodes=1)
    local = read_node_settings(tmp_path, {"SUBMITIT_LOCAL_JOB_ID": "90"}).ray_ports
    assert local.gcs_port == 10000 + (90 % NUM_BANDS) * 512
    assert job_key("t3f9a") == job_key("t3f9a") != job_key("t3f9b")  # ids that are not numbers


def test_named_ports_win_over_the_band_and_the_band_can_be_chosen(tmp_path):
    write_node_plan(tmp_path, num_nodes=2, ray_ports=RayPortsCfg(gcs_port=6379))
    env = slurm_env("4242", 0, HPCRL_RAY_DASHBOARD_PORT="7000", HPCRL_RAY_PORT_BAND="2")

    ports = read_node_settings(tmp_path, env).ray_ports

    assert (ports.gcs_port, ports.dashboard_port) == (6379, 7000)  # profile, environment
    assert (ports.client_server_port, ports.torch_master_port) == (11025, 11033)  # band 2
    assert (ports.min_worker_port, ports.max_worker_port) == (11040, 11535)
    with pytest.raises(
        NodeSettingsError,
        match="HPCRL_RAY_PORT_BAND=44 is not in 0..43; set it in that range, or unset it",
    ):
        read_node_settings(tmp_path, slurm_env("1", 0, HPCRL_RAY_PORT_BAND="44"))
