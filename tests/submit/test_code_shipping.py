"""Where a job's code and GPUs come from, through ``hpcrl submit --cluster <local profile>``.

Each test runs ``.venv/bin/hpcrl`` the way a user who never activated the venv does: PATH
without the venv, no PYTHONPATH. The "image" is the stand-in of tests/standin_image.py: a
Python that has torch and Ray but not hpcrl, submitit, cattrs or omegaconf. The Slurm
versions (two nodes, the pyxis stand-in) are in tests/slurm/test_container_jobs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standin_image import build_image
from tests.submit.jobs_harness import REPO, output_of, own_ray_ports_env

HPCRL = Path(sys.executable).parent / "hpcrl"  # the venv's console script, run by path
SHELL_PATH = "/usr/local/bin:/usr/bin:/bin"  # a login shell's PATH: no venv on it


def user_shell(profiles: Path, slot: int, **extra: str) -> dict[str, str]:
    """A shell that never activated the venv, with its own Ray port band for local jobs."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES")
        and not key.startswith("HPCRL_")
    }
    environ.update(PATH=SHELL_PATH, HPCRL_CLUSTER_PROFILES=str(profiles))
    environ.update(own_ray_ports_env(slot), **extra)
    return environ


def submit(args: list[str], cwd: Path, environ: dict[str, str], timeout_s: float = 900):
    return subprocess.run(
        [str(HPCRL), "submit", *args], cwd=cwd, env=environ, capture_output=True, text=True,
        timeout=timeout_s,
    )  # fmt: skip


def write_profile(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(f"name: {name}\n{body}")


LOCAL_CPU = """scheduler: local
device: cpu
worker_slots_per_node: 2
slurm: {gres_form: none, exclusive: false, time_limit: "01:00:00"}
env: {HF_HUB_OFFLINE: "1", OMP_NUM_THREADS: "1"}
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    return {
        "full": build_image(root / "full"),
        "no-ray": build_image(root / "no-ray", without=("ray",)),
    }


def node_log(run: Path) -> str:
    return (run / "logs" / "node0" / "attempt0" / "node.log").read_text()


#: Steps of the bundle's training run (as tests/slurm/test_container_jobs.py's 2-node one).
BUNDLE_RUN_STEPS = 3


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_local_job_runs_from_the_bundle_in_an_image_without_hpcrl(images, tmp_path):
    image_python = images["full"] / "bin" / "python3"
    write_profile(
        tmp_path / "profiles", "image", LOCAL_CPU + f"python: {image_python}\ncode: bundle\n"
    )
    run = tmp_path / "runs" / "demo"
    # A few steps: every step runs the same code (the demo saves no checkpoint and never
    # validates); its 20 steps to the documented reward are tests/core/test_demo.py's.
    result = submit(
        ["grpo-tiny-1n-cpu", "--cluster", "image", "-o", str(run), "--wait",
         f"grpo.max_num_steps={BUNDLE_RUN_STEPS}"],
        tmp_path, user_shell(tmp_path / "profiles", 11),
    )  # fmt: skip
    assert result.returncode == 0, output_of(result)
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == list(range(1, BUNDLE_RUN_STEPS + 1))
    (bundle,) = (tmp_path / "runs" / ".hpcrl-bundles").iterdir()
    log = node_log(run)
    assert f"preflight: python {image_python} (Python " in log
    assert f"hpcrl 0.1.0 from the bundle {bundle}" in log
    script = (run / "job.sbatch").read_text()
    assert f"exec {image_python} {bundle}/hpcrl_entry.py -u -m submitit.core._submit" in script
    header = " ".join(line.lstrip("#").strip() for line in script.splitlines() if line[:1] == "#")
    assert f"from the bundle {bundle}, shared read-only" in header


def test_an_image_without_ray_is_refused_by_submit_before_the_job(images, tmp_path):
    """A local job's Python is asked for its packages by every command that plans (issue 26:
    ``submit`` checks what ``validate`` checks), so the job never starts; the job's own
    preflight, which Slurm and container jobs meet, is tests/slurm/test_container_jobs.py's."""
    image_python = images["no-ray"] / "bin" / "python3"
    write_profile(
        tmp_path / "profiles", "noray", LOCAL_CPU + f"python: {image_python}\ncode: bundle\n"
    )
    run = tmp_path / "runs" / "demo"
    shell = user_shell(tmp_path / "profiles", 12)
    result = submit(
        ["grpo-tiny-1n-cpu", "--cluster", "noray", "-o", str(run), "--wait"], tmp_path, shell
    )
    assert result.returncode == 2, output_of(result)
    said = " ".join(result.stderr.split())
    assert (
        f"error python = '{image_python}' the job's Python lacks ray (every job needs "
        "ray>=2.49,<2.61) fix: install ray>=2.49,<2.61 for that Python, or set the profile's "
        "python to one that has it"
    ) in said, output_of(result)
    assert not run.exists()


def test_a_shell_without_the_venv_runs_the_venvs_python_in_the_job(tmp_path):
    """No container: the job's Python is the interpreter that ran hpcrl, by absolute path,
    whatever python3 the shell (or a node) finds first."""
    drivers = tmp_path / "drivers"
    drivers.mkdir()
    (drivers / "boundary_driver.py").write_text(
        "import json, sys, pathlib, submitit\n"
        "def record(run_dir):\n"
        "    pathlib.Path(run_dir, 'python.json').write_text(json.dumps(\n"
        "        {'executable': sys.executable, 'submitit': submitit.__file__}))\n"
        "    return 0\n"
    )
    write_profile(tmp_path / "profiles", "plain", LOCAL_CPU)
    run = tmp_path / "run"
    shell = user_shell(
        tmp_path / "profiles", 13, HPCRL_DRIVER="boundary_driver:record", PYTHONPATH=str(drivers)
    )
    result = submit(
        ["grpo-tiny-1n-cpu", "--cluster", "plain", "-o", str(run), "--wait"], tmp_path, shell
    )
    assert result.returncode == 0, output_of(result)
    seen = json.loads((run / "python.json").read_text())
    assert seen["executable"] == sys.executable
    assert seen["submitit"].startswith(str(Path(sys.executable).parent.parent))
    assert f"exec {sys.executable} -u -m submitit.core._submit" in (run / "job.sbatch").read_text()


def test_a_local_gpu_job_gets_the_gpus_the_user_made_visible(tmp_path):
    """GPU passing on this CPU machine: the user's CUDA_VISIBLE_DEVICES=3 becomes the plan's
    one GPU, the script exports it, and Ray starts with one GPU (submitit's local executor
    used to hide every GPU: "CUDA_VISIBLE_DEVICES contains []")."""
    write_profile(
        tmp_path / "profiles", "mygpu",
        "scheduler: local\ndevice: gpu\ngpus_per_node: auto\nslurm: {gres_form: none, exclusive: false}\n",
    )  # fmt: skip
    run = tmp_path / "run"
    shell = user_shell(
        tmp_path / "profiles", 14, CUDA_VISIBLE_DEVICES="3",
        HPCRL_DRIVER="tests.submit.drivers:record_gpus", PYTHONPATH=str(REPO),
    )  # fmt: skip
    args = ["grpo-tiny-1n-cpu", "cluster.gpus_per_node=1", "--cluster", "mygpu", "-o", str(run)]
    result = submit([*args, "--wait"], tmp_path, shell)
    assert result.returncode == 0, output_of(result)
    assert json.loads((run / "gpus.json").read_text()) == {
        "cuda_visible_devices": "3",
        "ray_gpus": 1.0,
    }
    assert "\nexport CUDA_VISIBLE_DEVICES=3\n" in (run / "job.sbatch").read_text()
