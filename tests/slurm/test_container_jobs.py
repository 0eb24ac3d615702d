"""The container and PATH boundaries on the real two-node Slurm cluster.

- The pyxis stand-in (pyxis_standin.c) runs a task given ``--container-image=<folder>`` with
  that folder's environment: the stand-in image of tests/standin_image.py, whose python3 has
  torch and Ray but not hpcrl, submitit, cattrs or omegaconf. The two-node GRPO demo must
  complete from the code bundle alone; an image without Ray must fail before Ray starts,
  naming ray and the fix.
- Without a container, a user who never activated the venv submits with ``.venv/bin/hpcrl``:
  the nodes' python3 has no submitit, the job must run the venv's interpreter anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.submit.job_record import read_job_record
from tests.require import unavailable
from tests.slurm.harness import run_slurm, wait_sacct_states
from tests.standin_image import build_image
from tests.submit.jobs_harness import TWO_NODE_RECIPE, output_of

pytestmark = [pytest.mark.slurm]

HPCRL = Path(sys.executable).parent / "hpcrl"
SHELL_PATH = "/usr/local/bin:/usr/bin:/bin"
REBUILD = "bash tests/slurm/cluster.sh start  # rebuilds the stand-in plugin in place"


def user_shell(profiles: Path, **extra: str) -> dict[str, str]:
    """A login shell that never activated the venv (sbatch exports it to the job)."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("HPCRL_")
    }
    environ.update(PATH=SHELL_PATH, HPCRL_CLUSTER_PROFILES=str(profiles), **extra)
    return environ


def pyxis_profile_text(name: str, image: Path) -> str:
    """slurm-test-pyxis with the stand-in image (run folders live under /tmp, mounted 1:1)."""
    return f"""name: {name}
scheduler: slurm
device: cpu
gpus_per_node: 0
worker_slots_per_node: 1
slurm: {{partition: debug, time_limit: "00:15:00", exclusive: false, gres_form: none,
        max_requeues: 0, signal_delay_s: 30}}
container: {{image: {image}, mounts: ["/tmp:/tmp"], workdir: /tmp, mount_home: false}}
env: {{HF_HUB_OFFLINE: "1", OMP_NUM_THREADS: "1", HF_HOME: /tmp/hpcrl-hf-home}}
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    return {
        "full": build_image(root / "full"),
        "no-ray": build_image(root / "no-ray", without=("ray",)),
    }


def task_python(image: Path) -> str:
    """What a task given ``--container-image=<image>`` runs as ``/usr/bin/env python3``."""
    code = "import os, sys; print(sys.executable, os.environ.get('PYTHONPATH'))"
    return run_slurm(
        "srun", "-N1", "-t", "2", f"--container-image={image}", "/usr/bin/env", "python3", "-c",
        code, timeout_s=120,
    ).strip()  # fmt: skip


@pytest.fixture(scope="module")
def image_standin(images) -> None:
    """The running cluster's stand-in must know image folders (pyxis_standin.c, this round)."""
    if task_python(images["full"]).startswith(str(images["full"])):
        return
    unavailable("slurm", f"the running pyxis stand-in predates image folders; as root: {REBUILD}")


def test_a_task_in_an_image_runs_the_images_python_with_its_environment(images, image_standin):
    image = images["full"]
    # The host's PYTHONPATH is dropped; the image's own is set, as entering an image does.
    environ = dict(os.environ, PYTHONPATH="/host/only")
    code = "import os, sys; print(sys.executable, os.environ.get('PYTHONPATH'), os.environ.get('VIRTUAL_ENV'))"
    out = subprocess.run(
        ["srun", "-N2", "-t", "2", f"--container-image={image}", "/usr/bin/env", "python3",
         "-c", code],
        capture_output=True, text=True, env=environ, timeout=120, check=True,
    ).stdout.splitlines()  # fmt: skip
    expected = f"{image}/bin/python3 {image}/image-pythonpath None"
    assert out == [expected, expected]


def submit(args: list[str], cwd: Path, environ: dict[str, str], timeout_s: float = 900):
    return subprocess.run(
        [str(HPCRL), "submit", *args], cwd=cwd, env=environ, capture_output=True, text=True,
        timeout=timeout_s,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_two_node_grpo_runs_from_the_bundle_in_an_image_without_hpcrl(
    images, image_standin, tmp_path
):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "pyxis-image.yaml").write_text(pyxis_profile_text("pyxis-image", images["full"]))
    run = tmp_path / "runs" / "demo"
    result = submit(
        [TWO_NODE_RECIPE, "--cluster", "pyxis-image", "-o", str(run), "--wait"],
        tmp_path, user_shell(profiles), timeout_s=1100,
    )  # fmt: skip
    assert result.returncode == 0, output_of(result)
    wait_sacct_states(read_job_record(run).job_id, ["COMPLETED"])
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 10
    (bundle,) = (tmp_path / "runs" / ".hpcrl-bundles").iterdir()
    for node in (0, 1):
        log = (run / "logs" / f"node{node}" / "attempt0" / "node.log").read_text()
        assert f"preflight: python {images['full']}/bin/python3 (Python " in log
        assert f"hpcrl 0.1.0 from the bundle {bundle}" in log
    assert "/usr/bin/env python3 " + f"{bundle}/hpcrl_entry.py" in (run / "job.sbatch").read_text()


def test_an_image_without_ray_fails_on_slurm_before_ray_naming_ray(images, image_standin, tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "pyxis-noray.yaml").write_text(pyxis_profile_text("pyxis-noray", images["no-ray"]))
    run = tmp_path / "runs" / "demo"
    shell = user_shell(profiles)
    result = submit([TWO_NODE_RECIPE, "--cluster", "pyxis-noray", "-o", str(run), "--wait"],
                    tmp_path, shell)  # fmt: skip
    assert result.returncode == 1, output_of(result)
    flat = result.stdout.replace("\n", " ")
    assert "ray is missing (every job needs ray==2.60.0)" in flat, output_of(result)
    assert "Fix: use a container image with ray==2.60.0 (the profile's container.image)" in flat
    job_id = read_job_record(run).job_id
    wait_sacct_states(job_id, ["FAILED"])
    elapsed = run_slurm("sacct", "-n", "-X", "-P", "-o", "ElapsedRaw", "-j", job_id).split()[0]
    print(f"preflight failure: job {job_id} ran {elapsed} s (sacct ElapsedRaw)")
    # Failed before Ray: no node started it.
    assert not list((run / "logs").glob("node*/attempt0/ray.out"))
    status = subprocess.run([str(HPCRL), "status", str(run)], env=shell, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert "FAILED" in status.stdout and "ray is missing" in status.stdout, output_of(status)


def test_a_shell_without_the_venv_submits_a_job_that_runs_the_venvs_python(tmp_path):
    """The nodes' python3 lacks submitit; the job runs the interpreter that ran hpcrl."""
    drivers = tmp_path / "drivers"
    drivers.mkdir()
    (drivers / "boundary_driver.py").write_text(
        "import json, os, sys, pathlib, submitit\n"
        "def record(run_dir):\n"
        "    pathlib.Path(run_dir, 'python.json').write_text(json.dumps({'executable':\n"
        "        sys.executable, 'submitit': submitit.__file__, 'path': os.environ['PATH']}))\n"
        "    return 0\n"
    )
    nodes_python = subprocess.run(
        ["srun", "-N1", "-t", "2", "python3", "-c", "import submitit"],
        env=user_shell(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert nodes_python.returncode != 0, "the boundary needs a python3 without submitit on PATH"
    run = tmp_path / "run"
    shell = user_shell(tmp_path, HPCRL_DRIVER="boundary_driver:record", PYTHONPATH=str(drivers))
    result = submit([TWO_NODE_RECIPE, "--cluster", "slurm-test", "-o", str(run), "--wait"],
                    tmp_path, shell)  # fmt: skip
    assert result.returncode == 0, output_of(result)
    seen = json.loads((run / "python.json").read_text())
    assert seen["executable"] == sys.executable and seen["path"] == SHELL_PATH
    assert seen["submitit"].startswith(str(Path(sys.executable).parent.parent))
