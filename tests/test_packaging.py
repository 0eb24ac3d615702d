"""Packaging: every package ships, the built wheel renders on its own, render stays light."""

from __future__ import annotations

import configparser
import json
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
    # the model table is package data validate reads from the wheel
    table = (
        "from hpcrl.config.hf_model_table import known_hf_config as k; print(k('Qwen/Qwen3-32B'))"
    )
    read = subprocess.run(
        [sys.executable, "-c", table], capture_output=True, text=True, env=environ, cwd=work,
        check=True, timeout=60,
    )  # fmt: skip
    assert read.stdout == "{'model_type': 'qwen3', 'architectures': ['Qwen3ForCausalLM']}\n"
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
    # the compile cache sits beside the run folder (hpcrl.plan.compile_cache): /runs there
    script = script.replace(str(work / ".hpcrl-cache"), "/runs/.hpcrl-cache")
    # -o is part of the command that wrote it; the golden file was planned without one.
    written_by = "# Written by: hpcrl render grpo-tiny-1n-cpu --cluster local"
    assert f"{written_by} -o {GOLDEN_RUN_DIR}\n" in script
    assert script.replace(f"{written_by} -o {GOLDEN_RUN_DIR}\n", f"{written_by}\n") == (
        GOLDEN.read_text()
    )
    assert (work / "tmp" / "manifest.json").exists() and (
        work / "tmp" / "recipe.resolved.yaml"
    ).exists()


#: Run by the start-up tests: the CLI as the ``hpcrl`` script runs it, then every module it
#: loaded (less those the interpreter had loaded before it: site's, a .pth file's) into $OUT.
CLI_WITH_MODULE_LIST = """
import atexit, json, os, runpy, sys
before = set(sys.modules)
atexit.register(lambda: open(os.environ["HPCRL_TEST_MODULES_OUT"], "w").write(
    json.dumps(sorted(set(sys.modules) - before))))
sys.argv[0] = "hpcrl"
runpy.run_module("hpcrl.cli.main", run_name="__main__", alter_sys=True)
"""
#: The packages besides the standard library and hpcrl that the login node's commands may
#: load at start-up. A package not listed fails the test below: measure what it costs
#: (``python -X importtime -m hpcrl.cli.main ...``) before adding it, or import it where it
#: is used. ``hpcrl validate`` is the budget that matters (docs/performance.md: ≤ 300 ms).
START_UP_PACKAGES = frozenset({
    "attr", "attrs", "cattrs",  # the config classes and their converter
    "omegaconf", "yaml",  # reading recipes and profiles (omegaconf vendors its antlr4)
    "typing_extensions",  # cattrs'
    "rich",  # validate's plan table, status
    "jinja2", "markupsafe",  # render: the templates
    "submitit", "cloudpickle",  # submit, status: job records
})  # fmt: skip
#: Not at start-up, whatever the command: what importing each costs alone on the CI box (2
#: cores, warm file cache, `python -c pass` 30-50 ms; best of 3, 2026-12-03): megatron.core
#: 7.6 s, transformers 3.6 s, torch 2.1 s, datasets 1.8 s, matplotlib.pyplot 1.0 s (matplotlib
#: 0.35 s: `hpcrl report` imports it when it draws), pandas 0.59 s, ray 0.57 s, pyarrow 0.25 s,
#: numpy 0.19 s, requests 0.17 s; vllm imports torch. Each alone would break the 300 ms.
HEAVY_AT_START_UP = (
    *HEAVY_MODULES, "numpy", "pandas", "matplotlib", "scipy", "pyarrow", "datasets", "requests",
)  # fmt: skip


def cli_start_up_modules(argv: list[str], cwd: Path) -> set[str]:
    """Every module ``hpcrl ARGV`` loads, run in a fresh interpreter from ``cwd``."""
    out = cwd / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", CLI_WITH_MODULE_LIST, *argv],
        capture_output=True, text=True, cwd=cwd, timeout=120,
        env=job_environment(HPCRL_TEST_MODULES_OUT=str(out)),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return set(json.loads(out.read_text()))


def _cython_runtime(name: str) -> bool:
    """What any Cython-built extension (PyYAML's C loader) registers besides itself."""
    return name == "cython_runtime" or name.startswith("_cython_")


#: What validate and --help never load (docs/performance.md, item 6): the run folder's
#: writing side (the code bundle writer, the folder lock: with them tempfile, secrets),
#: importlib.resources (with zipfile, tempfile): the shipped folders and data files are found
#: through their module specs (``hpcrl.config.locate``); ~6 ms of every validate here; and
#: subprocess: validate starts no process here (no git: the checkout's commit is named in
#: written files only; no package probe: the job's Python is this one).
NOT_AT_VALIDATE = frozenset({
    "hpcrl.render.run_folder", "hpcrl.render.bundle_writer", "hpcrl.run.folder_lock",
    "importlib.resources", "subprocess",
})  # fmt: skip
#: What validate of plain files (no ``${...}``, no ``???``, no override) never loads: OmegaConf
#: and its vendored parser, ~40 ms here (hpcrl.config.plain_config; hpcrl.config.yaml_loader).
NOT_AT_PLAIN_VALIDATE = frozenset({"omegaconf", "antlr4"})
#: Shipped plain files, in START_UP_COMMANDS (grpo-tiny-1n-cpu interpolates: base/grpo.yaml).
PLAIN_VALIDATE = "validate sft-tiny-1n-cpu --cluster local"


START_UP_COMMANDS = {
    # command: a module that proves the run went down that command's path
    "--help": "hpcrl.cli.jobs",  # (the parser: every command module, nothing they run)
    "validate grpo-tiny-1n-cpu --cluster local": "hpcrl.plan.job_python",
    PLAIN_VALIDATE: "hpcrl.plan.job_python",
    "validate grpo-llama-1b-1n1g-megatron --cluster slurm-test": "hpcrl.plan.checkpoint_dir",
    "render grpo-tiny-1n-cpu --cluster local -o run": "hpcrl.render.script",
    # slurm-test-pyxis mounts /tmp only: the data must be there (hpcrl.plan.environment)
    "render grpo-tiny-2n-cpu --cluster slurm-test-pyxis -o bundled data.train_path={cwd}/d.jsonl": (
        "hpcrl.render.bundle_writer"
    ),
}


@pytest.mark.parametrize("command", START_UP_COMMANDS)
def test_cli_start_up_imports_no_heavy_module(command, tmp_path):
    """The login node's commands load the standard library, hpcrl and START_UP_PACKAGES only:
    never the training stack, nor a data or plotting library (HEAVY_AT_START_UP, with what
    each costs). The import set is asserted, not a time: a time would be flaky on a shared box
    (benchmarks/cli_latency.py measures it)."""
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n' * 64)
    loaded = cli_start_up_modules([word.format(cwd=tmp_path) for word in command.split()], tmp_path)
    assert START_UP_COMMANDS[command] in loaded  # the run went where the command goes
    tops = {name.split(".")[0] for name in loaded}
    heavy = sorted(tops & set(HEAVY_AT_START_UP))
    assert not heavy, f"hpcrl {command} imported {heavy}"
    others = sorted(
        name for name in tops - set(sys.stdlib_module_names) - {"hpcrl"} - START_UP_PACKAGES
        if not _cython_runtime(name)
    )  # fmt: skip
    assert not others, (
        f"hpcrl {command} imported {others} at start-up: import it where it is used, or "
        "measure its cost and add it to START_UP_PACKAGES"
    )
    if command.startswith(("--help", "validate")):
        rendering = sorted(tops & {"jinja2", "submitit"})
        assert not rendering, f"hpcrl {command} renders and submits nothing: {rendering}"
        writing = sorted(loaded & NOT_AT_VALIDATE)
        assert not writing, f"hpcrl {command} writes nothing: {writing} (see NOT_AT_VALIDATE)"
    if command == PLAIN_VALIDATE:
        parsing = sorted(tops & NOT_AT_PLAIN_VALIDATE)
        assert not parsing, f"hpcrl {command} needs no OmegaConf: {parsing} (NOT_AT_PLAIN_VALIDATE)"


def test_export_start_up_imports_no_heavy_module(tmp_path):
    """``hpcrl export`` picks the checkpoint and refuses on the login node with hpcrl alone
    (torch, transformers, megatron only in the export's own process, with the run's Python);
    here down to a checkpoint whose Hugging Face folder the job already wrote."""
    cli_start_up_modules(["render", "sft-tiny-1n-cpu", "--cluster", "local", "-o", "run"], tmp_path)
    written_by_job = tmp_path / "run" / "checkpoints" / "step_000001" / "hf"
    written_by_job.mkdir(parents=True)
    (written_by_job / "hpcrl_export.json").write_text("{}")
    loaded = cli_start_up_modules(["export", "run"], tmp_path)
    assert "hpcrl.submit.exports" in loaded  # the run went down export's path
    tops = {name.split(".")[0] for name in loaded}
    assert sorted(tops & set(HEAVY_AT_START_UP)) == []
    others = tops - set(sys.stdlib_module_names) - {"hpcrl"} - START_UP_PACKAGES
    assert sorted(name for name in others if not _cython_runtime(name)) == []


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
print(" ".join(sorted(name for name in sys.modules if name.split(".")[0] in {HEAVY_AT_START_UP!r})))
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
