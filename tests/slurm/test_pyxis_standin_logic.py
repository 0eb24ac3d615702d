"""The pyxis stand-in's image logic, compiled with a stand-in SPANK host (spank_fake.c) and
run as one task would be, without slurmstepd: it checks pyxis_standin.c as it is in the
working tree, also before the running cluster has rebuilt its plugin from it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.require import unavailable
from tests.standin_image import build_image

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def fake_step(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None or not Path("/usr/include/slurm/spank.h").exists():
        unavailable(
            "slurm", "gcc and libslurm-dev are needed (bash tests/slurm/cluster.sh install)"
        )
    program = tmp_path_factory.mktemp("fake-step") / "fake-step"
    subprocess.run(
        ["gcc", "-Wall", "-Wextra", "-Werror", "-o", str(program),
         str(HERE / "pyxis_standin.c"), str(HERE / "spank_fake.c")],
        check=True, timeout=120,
    )  # fmt: skip
    return program


def run_task(fake_step: Path, image: str | None, **environ: str) -> str:
    env = {"PATH": "/usr/bin:/bin", **environ}
    if image is not None:
        env["FAKE_SPANK_OPT_CONTAINER_IMAGE"] = image
    code = (
        "import os, sys; print(sys.executable, os.environ.get('PYTHONPATH'), "
        "os.environ.get('VIRTUAL_ENV'), os.environ.get('PYXIS_STANDIN_CONTAINER_IMAGE'))"
    )
    return subprocess.run(
        [str(fake_step), "/usr/bin/env", "python3", "-c", code],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip


def test_an_image_folder_gives_the_task_its_python_and_variables(fake_step, tmp_path):
    image = build_image(tmp_path / "img")
    out = run_task(fake_step, str(image), PYTHONPATH="/host/repo", VIRTUAL_ENV="/host/venv")
    assert out == f"{image}/bin/python3 {image}/image-pythonpath None {image}"


def test_a_registry_image_name_changes_no_variable(fake_step):
    out = run_task(fake_step, "nvcr.io/nvidia/nemo-rl:v0.4.0", PYTHONPATH="/host/repo")
    assert out.split()[1:] == ["/host/repo", "None", "nvcr.io/nvidia/nemo-rl:v0.4.0"]
    assert not out.startswith("/tmp")


def test_no_container_no_change(fake_step):
    assert run_task(fake_step, None, PYTHONPATH="/host/repo").split()[1:] == [
        "/host/repo", "None", "None",
    ]  # fmt: skip
