"""Cluster-profile rules: each names the key, the value and the fix."""

import pytest

from hpcrl.config import structure_profile
from hpcrl.config.profile_rules import check_profile


def problems_for(**sections):
    data = {"name": "site", "scheduler": "slurm", "device": "gpu", **sections}
    return {problem.path: problem for problem in check_profile(structure_profile(data))}


def test_defaults_are_clean():
    assert problems_for() == {}


@pytest.mark.parametrize(
    "time_limit, ok",
    [
        ("04:00:00", True),
        ("30", True),
        ("1-00:00:00", True),
        ("2-12", True),
        ("4h", False),
        ("", False),
    ],
)
def test_time_limit_forms(time_limit, ok):
    problems = problems_for(slurm={"time_limit": time_limit})
    assert ("slurm.time_limit" not in problems) == ok


def test_cpu_profile_must_not_request_gpus():
    problem = problems_for(device="cpu", slurm={"gres_form": "gres"})["slurm.gres_form"]
    assert problem.fix == "set slurm.gres_form: none"


def test_gpu_profile_without_gres_is_a_warning():
    problem = problems_for(slurm={"gres_form": "none"})["slurm.gres_form"]
    assert problem.severity == "warning"


def test_container_on_the_local_scheduler():
    problem = problems_for(
        scheduler="local", device="cpu", slurm={"gres_form": "none"}, container={"image": "x"}
    )["container"]
    assert problem.value == "x" and "pyxis" in problem.message


def test_ports_must_not_collide_or_sit_in_the_worker_band():
    problems = problems_for(
        ray_ports={"gcs_port": 6379, "dashboard_port": 6379, "node_manager_port": 7500,
                   "metrics_export_port": 80, "min_worker_port": 7000, "max_worker_port": 7999}
    )  # fmt: skip
    assert problems["ray_ports.dashboard_port"].message == "same port as ray_ports.gcs_port"
    assert "worker port band 7000..7999" in problems["ray_ports.node_manager_port"].message
    assert problems["ray_ports.metrics_export_port"].message == "not a TCP port"


def test_worker_band_must_be_ordered_and_set_at_both_ends():
    assert "ray_ports.min_worker_port" in problems_for(
        ray_ports={"min_worker_port": 9000, "max_worker_port": 8000}
    )
    problem = problems_for(ray_ports={"max_worker_port": 8000})["ray_ports.max_worker_port"]
    assert problem.message == "set without the other end of the worker port range"


def test_unset_ports_come_from_the_job_band_so_named_ports_stay_out_of_it():
    assert not [p for p in problems_for().values() if p.path.startswith("ray_ports")]
    problem = problems_for(ray_ports={"gcs_port": 20000})["ray_ports.gcs_port"]
    assert problem.message == (
        "inside the per-job Ray port bands 10000..32527, which the unset ports come from"
    )
    assert "ray_ports.gcs_port" not in problems_for(ray_ports={"gcs_port": 6379})


def test_secrets_belong_in_pass_env():
    problem = problems_for(env={"WANDB_API_KEY": "abc123", "HF_HOME": "/x"})["env.WANDB_API_KEY"]
    assert problem.value == "<hidden>" and "abc123" not in problem.format()
    assert "add WANDB_API_KEY to pass_env" in problem.fix


def test_pass_env_takes_names_not_values():
    problem = problems_for(pass_env=["HF_TOKEN", "HF_TOKEN=abc"])["pass_env[1]"]
    assert problem.value == "HF_TOKEN=abc"


@pytest.mark.parametrize(
    "mount, ok",
    [("/a:/b", True), ("/a:/b:ro", True), ("a:/b", False), ("/a", False), ("/a:/b:ro:x", False)],
)
def test_mounts_are_host_container_flags(mount, ok):
    problems = problems_for(container={"image": "img", "mounts": [mount]})
    assert ("container.mounts[0]" not in problems) == ok


@pytest.mark.parametrize("key, value", [("gpus_per_node", 0), ("cpus_per_node", 0)])
def test_counts_positive(key, value):
    assert key in problems_for(**{key: value})
