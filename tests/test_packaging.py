"""Packaging: every package ships, the built wheel renders on its own, render stays light."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "render" / "golden" / "grpo-tiny-1n-cpu__local.sbatch"
GOLDEN_RUN_DIR = "/runs/golden"
GOLDEN_HOME = "/home/golden"
GOLDEN_PYTHON = "/golden/venv/bin/python"  # tests/plan/planning_inputs.py
HEAVY_MODULES = ("torch", "ray", "transformers", "megatron", "vllm")
COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "runs",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".hypothesis",
    ".pytest_cache",
    ".ruff_cache",
    "tests",
    "benchmarks",
    ".cache",
    ".whl",
)


def declared_packages() -> set[str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return {line.strip() for line in config["options"]["packages"].splitlines() if line.strip()}


def test_every_python_folder_is_a_declared_package():
    folders = {
        path.parent for path in (REPO / "hpcrl").rglob("*.py") if "__pycache__" not in path.parts
    }
    packages = {".".join(folder.relative_to(REPO).parts) for folder in folders}
    missing = sorted(packages - declared_packages())
    assert not missing, f"add these to [options] packages in setup.cfg: {missing}"
    for mapped in ("hpcrl.templates", "hpcrl.recipes", "hpcrl.cluster_profiles"):
        assert mapped in declared_packages()


def job_environment(**extra: str) -> dict[str, str]:
    environ = {
        key: value for key, value in os.environ.items() if not key.startswith(("HPCRL_", "PYTHON"))
    }
    environ.update(HOME=GOLDEN_HOME, XDG_CONFIG_HOME="/nonexistent-hpcrl-config", **extra)
    return environ


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the working tree and install it with ``pip --target``.

    ``--target`` (not a venv) because the dependencies come from this interpreter's
    site-packages, while hpcrl itself must come only from the wheel.
    """
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=COPY_IGNORE)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(source)],
        check=True,
        timeout=300,
        cwd=root,
    )
    (wheel,) = (root / "dist").glob("hpcrl-*.whl")
    target = root / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, timeout=300
    )
    return target


def test_installed_wheel_renders_the_golden_script(installed_wheel, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    environ = job_environment(PYTHONPATH=str(installed_wheel))
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import hpcrl, hpcrl.templates as t; print(hpcrl.__file__); print(t.__file__)",
        ],
        capture_output=True,
        text=True,
        env=environ,
        cwd=work,
        check=True,
        timeout=60,
    ).stdout.split()
    assert all(path.startswith(str(installed_wheel)) for path in where), where
    result = subprocess.run(
        [
            str(installed_wheel / "bin" / "hpcrl"),
            "render",
            "grpo-tiny-1n-cpu",
            "--cluster",
            "local",
            "-o",
            "tmp",
        ],
        capture_output=True,
        text=True,
        env=environ,
        cwd=work,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    script = (work / "tmp" / "job.sbatch").read_text()
    # Without a container the job runs the interpreter that ran hpcrl (the wheel's console
    # script names this one); the golden file has a fixed one.
    script = script.replace(str(work / "tmp"), GOLDEN_RUN_DIR).replace(
        sys.executable, GOLDEN_PYTHON
    )
    # -o is part of the command that wrote it; the golden file was planned without one.
    written_by = "# Written by: hpcrl render grpo-tiny-1n-cpu --cluster local"
    assert f"{written_by} -o {GOLDEN_RUN_DIR}\n" in script
    assert script.replace(f"{written_by} -o {GOLDEN_RUN_DIR}\n", f"{written_by}\n") == (
        GOLDEN.read_text()
    )
    assert (work / "tmp" / "manifest.json").exists() and (
        work / "tmp" / "recipe.resolved.yaml"
    ).exists()


def test_render_imports_no_training_stack(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "hpcrl.cli.main",
            "render",
            "grpo-tiny-1n-cpu",
            "--cluster",
            "local",
            "-o",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env=job_environment(),
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {
        line.split("|")[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "hpcrl.render.script" in imported  # the measurement saw the render path
    heavy = sorted(name for name in imported if name.split(".")[0] in HEAVY_MODULES)
    assert not heavy, f"hpcrl render imported {heavy}"


LOGIN_PACKAGES = ("config", "run", "plan", "render", "submit", "report", "cli")
IMPORT_EVERY_LOGIN_MODULE = f"""
import importlib, pkgutil, sys
names = []
for package in {LOGIN_PACKAGES!r}:
    module = importlib.import_module("hpcrl." + package)
    names.append(module.__name__)
    names += [info.name for info in pkgutil.walk_packages(module.__path__, module.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(" ".join(names))
print(" ".join(sorted(name for name in sys.modules if name.split(".")[0] in {HEAVY_MODULES!r})))
"""


def test_every_login_node_module_imports_no_training_stack(tmp_path):
    """Every module of the login-node stages, not only those `hpcrl render` reaches: a module
    that pulled in torch (even through another module) would fail here."""
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_LOGIN_MODULE],
        capture_output=True,
        text=True,
        env=job_environment(PYTHONPATH=str(REPO)),
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    walked, heavy = (result.stdout.splitlines() + ["", ""])[:2]
    # Modules added this round, named so that moving them out of the walk is noticed.
    for name in ("hpcrl.config.port_bands", "hpcrl.plan.generation",
                 "hpcrl.config.secrets", "hpcrl.plan.data_files"):  # fmt: skip
        assert name in walked.split(), name
    assert heavy == "", f"login-node modules imported {heavy}"
