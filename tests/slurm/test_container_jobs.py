"""The container and PATH boundaries on the real two-node Slurm cluster.

- The pyxis stand-in (pyxis_standin.c) runs a task given ``--container-image=<folder>`` with
  that folder's environment: the stand-in image of tests/standin_image.py, whose python3 has
  torch and Ray but not hpcrl, submitit, cattrs or omegaconf. The two-node GRPO demo must
  complete from the code bundle alone; an image without Ray must fail before Ray starts,
  naming ray and the fix.
- An image shaped like NeMo RL's (its own Ray 2.49.2, older than Ray token authentication,
  instead of .venv's 2.60): with the default ``ray_auth: token`` every node refuses it in
  seconds, naming the Ray found and both fixes; with ``ray_auth: none`` a two-node GRPO job
  runs on it (Ray across both nodes, placement by node label, the training group, refits).
- Without a container, a user who never activated the venv submits with ``.venv/bin/hpcrl``:
  the nodes' python3 has no submitit, the job must run the venv's interpreter anyway.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.job.preflight import ray_has_token_auth
from hpcrl.run.job_record import read_job_record
from tests.require import unavailable
from tests.slurm.harness import run_slurm, wait_sacct_states
from tests.standin_image import (
    build_image,
    dependency_report,
    imports_in,
    standin_requirement,
    wheel_cache,
)
from tests.submit.jobs_harness import RECIPES, TWO_NODE_RECIPE, output_of

pytestmark = [pytest.mark.slurm]

#: Steps of the bundle's training run (as tests/submit/test_code_shipping.py's local one).
BUNDLE_RUN_STEPS = 3

HPCRL = Path(sys.executable).parent / "hpcrl"
SHELL_PATH = "/usr/local/bin:/usr/bin:/bin"
REBUILD = "bash tests/slurm/cluster.sh start  # rebuilds the stand-in plugin in place"
DRIVERS = Path(__file__).resolve().parents[1] / "job" / "drivers.py"


def user_shell(profiles: Path, **extra: str) -> dict[str, str]:
    """A login shell that never activated the venv (sbatch exports it to the job)."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("HPCRL_")
    }
    environ.update(PATH=SHELL_PATH, HPCRL_CLUSTER_PROFILES=str(profiles), **extra)
    return environ


def pyxis_profile_text(name: str, image: Path, extra: str = "") -> str:
    """slurm-test-pyxis with the stand-in image (run folders live under /tmp, mounted 1:1;
    the shipped recipes' data folder mounted read-only, as hpcrl's plan requires)."""
    data = RECIPES / "data"
    return f"""name: {name}
{extra}scheduler: slurm
device: cpu
gpus_per_node: 0
worker_slots_per_node: 1
slurm: {{partition: debug, time_limit: "00:15:00", exclusive: false, gres_form: none,
        max_requeues: 0, signal_delay_s: 30}}
container: {{image: {image}, mounts: ["/tmp:/tmp", "{data}:{data}:ro"], workdir: /tmp,
            mount_home: false}}
env: {{HF_HUB_OFFLINE: "1", OMP_NUM_THREADS: "1", HF_HOME: /tmp/hpcrl-hf-home}}
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    return {
        "full": build_image(root / "full"),
        "no-ray": build_image(root / "no-ray", without=("ray",)),
    }


@pytest.fixture(scope="module")
def nemo_rl_image(tmp_path_factory) -> tuple[Path, str]:
    """(image, its Ray version): .venv's heavy packages but Ray from tests/standin_wheels.txt
    (NeMo RL's 2.49.2) in the image's own site-packages, its dependencies from the image."""
    ray = standin_requirement("ray")
    (version,) = (spec.version for spec in ray.specifier)
    if not list(wheel_cache().glob(f"ray-{version}-*.whl")):
        unavailable(
            "deps", f"no ray {version} wheel in {wheel_cache()}: run `bash .ci/standin-wheels`"
        )
    image = build_image(
        tmp_path_factory.mktemp("images") / "nemo-rl",
        own_requirements=(f"ray[default]=={version}",),
    )  # fmt: skip
    report = dependency_report(image, "ray", ("default",))
    print("\n".join(report))  # the image's Ray and what it found for each of its requirements
    assert report[0] == f"ray {version}"
    assert not [line for line in report[1:] if not line.startswith("ok ")], report
    seen = imports_in(image, ("ray", "torch", "hpcrl", "submitit", "cattrs"), image)
    assert seen == {"ray": True, "torch": True, "hpcrl": False, "submitit": False, "cattrs": False}
    # What the preflight looks for in a Ray without metadata is indeed absent from this one.
    (site,) = image.glob("lib/python3*/site-packages")
    assert not ray_has_token_auth([str(site)])
    return image, version


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
    # A few steps: every step runs the same code (the demo saves no checkpoint and never
    # validates); the 2-node demo's full run is tests/submit/test_slurm_faults.py's job.
    result = submit(
        [TWO_NODE_RECIPE, "--cluster", "pyxis-image", "-o", str(run), "--wait",
         f"grpo.max_num_steps={BUNDLE_RUN_STEPS}"],
        tmp_path, user_shell(profiles), timeout_s=1100,
    )  # fmt: skip
    assert result.returncode == 0, output_of(result)
    wait_sacct_states(read_job_record(run).job_id, ["COMPLETED"])
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == list(range(1, BUNDLE_RUN_STEPS + 1))
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
    # The failing node's 1, also when node 1 fails first and srun ends node 0 (sacct's 15).
    assert result.returncode == 1, output_of(result)
    failed = re.search(r"FAILED: job \d+ FAILED, exit code 1 \(preflight on node ([01]) \(n[12]\): ",
                       " ".join(result.stdout.split()))  # fmt: skip
    assert failed, output_of(result)
    flat = result.stdout.replace("\n", " ")
    assert "ray is missing (every job needs ray>=2.49,<2.61)" in flat, output_of(result)
    assert "fix: use a container image with ray>=2.49,<2.61 (the profile's container.image)" in flat
    job_id = read_job_record(run).job_id
    wait_sacct_states(job_id, ["FAILED"])
    elapsed_s = int(
        run_slurm("sacct", "-n", "-X", "-P", "-o", "ElapsedRaw", "-j", job_id).split()[0]
    )
    assert elapsed_s < 60, f"the preflight failure took {elapsed_s} s"
    # Failed before Ray: no node started it.
    assert not list((run / "logs").glob("node*/attempt0/ray.out"))
    # One named cause, no stack: submitit's logs of every task hold no traceback.
    logs = {path.name: path.read_text() for path in (run / "submitit").glob("*_log.*")}
    assert logs and not [name for name, text in logs.items() if "Traceback" in text], logs
    assert any("hpcrl: preflight failed: " in text for text in logs.values()), logs
    # (--json: the table folds a long cause at a width that depends on the run's path)
    status = subprocess.run([str(HPCRL), "status", "--json", str(run)], env=shell,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    (shown,) = json.loads(status.stdout)
    assert shown["state"] == "FAILED" and "ray is missing" in shown["cause"], output_of(status)
    assert shown["exit_code"] == 1 and shown["cause"].startswith("preflight on node ")


def test_an_image_with_ray_older_than_token_auth_is_refused_on_every_node_naming_the_fixes(
    nemo_rl_image, image_standin, tmp_path
):
    image, version = nemo_rl_image
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "pyxis-nemo.yaml").write_text(pyxis_profile_text("pyxis-nemo", image))
    run = tmp_path / "runs" / "demo"
    shell = user_shell(profiles)
    result = submit([TWO_NODE_RECIPE, "--cluster", "pyxis-nemo", "-o", str(run), "--wait"],
                    tmp_path, shell)  # fmt: skip
    # The failing node's 1, also when node 1 fails first and srun ends node 0 (sacct's 15).
    assert result.returncode == 1, output_of(result)
    failed = re.search(r"FAILED: job \d+ FAILED, exit code 1 \(preflight on node ([01]) \(n[12]\): ",
                       " ".join(result.stdout.split()))  # fmt: skip
    assert failed, output_of(result)
    flat = " ".join(result.stdout.split())
    assert (
        f"ray {version} predates Ray token authentication (ray>=2.52), which the cluster "
        "profile's ray_auth: token (the default) needs; fix: use a container image with "
        "ray>=2.52 (the profile's container.image), or set ray_auth: none in the cluster "
        "profile to run the job's Ray without authentication"
    ) in flat, output_of(result)
    job_id = read_job_record(run).job_id
    wait_sacct_states(job_id, ["FAILED"])
    elapsed_s = int(
        run_slurm("sacct", "-n", "-X", "-P", "-o", "ElapsedRaw", "-j", job_id).split()[0]
    )
    assert elapsed_s < 60, f"the refusal took {elapsed_s} s"
    assert not list((run / "logs").glob("node*/attempt0/ray.out"))  # no node started Ray
    # The failing node's log says why; the other node's, when srun ended it before it wrote
    # one (a loaded machine: CI, 2026-12-04), says the same.
    node_logs = [run / "logs" / f"node{node}" / "attempt0" / "node.log" for node in (0, 1)]
    assert node_logs[int(failed.group(1))].is_file(), output_of(result)
    for node_log in (path for path in node_logs if path.is_file()):
        log = node_log.read_text()
        assert f"ok             ray {version} (needs >=2.49,<2.61; every job)" in log
        assert f"TOO OLD        Ray token authentication (ray {version}; " in log


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_node_grpo_runs_on_the_ray_of_a_nemo_rl_image_with_ray_auth_none(
    nemo_rl_image, image_standin, tmp_path
):
    image, version = nemo_rl_image
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "pyxis-nemo.yaml").write_text(
        pyxis_profile_text("pyxis-nemo", image, extra="ray_auth: none\n")
    )
    # The test drivers ride in the image's own import path (its PYTHONPATH), as a user's would.
    (image / "image-pythonpath" / "hpcrl_test_drivers.py").write_text(DRIVERS.read_text())
    run = tmp_path / "runs" / "demo"
    steps_wanted = 2
    shell = user_shell(profiles, HPCRL_DRIVER="hpcrl_test_drivers:probe_then_train")
    result = submit(
        [TWO_NODE_RECIPE, "--cluster", "pyxis-nemo", "-o", str(run), "--wait",
         f"grpo.max_num_steps={steps_wanted}"],
        tmp_path, shell, timeout_s=550,
    )  # fmt: skip
    assert result.returncode == 0, output_of(result)
    assert "Ray token authentication is off" in " ".join(result.stderr.split())  # never silent
    wait_sacct_states(read_job_record(run).job_id, ["COMPLETED"])
    ready = json.loads((run / "status" / "ray_ready").read_text())
    assert ready["num_nodes"] == 2 and len(set(ready["node_ips"])) == 2, ready
    probe = json.loads((run / "probe.json").read_text())
    assert probe["problems"] == [] and probe["alive_node_ips"] == sorted(ready["node_ips"])
    # Rank r on node r: the placement group's node-label selectors hold on this Ray.
    placement = json.loads((run / "placement.json").read_text())
    assert [rank["node_ip"] for rank in placement] == ready["node_ips"], placement
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == list(range(1, steps_wanted + 1))
    assert all(math.isfinite(row["loss"]) for row in steps), steps
    for node in (0, 1):
        log = (run / "logs" / f"node{node}" / "attempt0" / "node.log").read_text()
        assert f"preflight: python {image}/bin/python3 (Python " in log
        assert f"ok             ray {version} (needs >=2.49,<2.61; every job)" in log
        assert "Ray token authentication" not in log  # nothing to check with ray_auth: none


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
