"""What ``hpcrl validate`` finds before the job would: a model an offline job cannot load from
its Hugging Face cache, a package a local job's Python lacks. Real folders laid out as the
hub cache lays them out, real interpreters (this venv's, and a bare venv without packages)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from hpcrl.cli.main import main
from hpcrl.plan.hf_cache import check_models_cached, job_hub_cache, on_this_machine
from hpcrl.plan.job_python import check_job_python
from hpcrl.plan.planner import plan
from hpcrl.plan.requirements import SUPPORTED
from tests.plan.planning_inputs import (
    GOLDEN_HOST,
    isolate_from_user_profiles,
    local_profile,
    pyxis_profile,
)
from tests.recipe_builder import automodel_recipe, with_policy

MODEL = "Qwen/Qwen2.5-0.5B"


@pytest.fixture
def validate(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*argv: str) -> tuple[int, str]:
        code = main(["validate", *argv])
        captured = capsys.readouterr()
        return code, captured.err

    return run


def _cache(root: Path, *names: str) -> Path:
    hub = root / "hub"
    hub.mkdir(parents=True)
    for name in names:
        (hub / f"models--{name.replace('/', '--')}" / "snapshots" / "0123abc").mkdir(parents=True)
    return hub


def test_an_offline_job_needs_the_model_in_its_cache(validate, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # local jobs inherit the shell's
    hub = _cache(tmp_path / "hf")
    code, err = validate("grpo-tiny-1n-cpu", "--cluster", "local", f"policy.model_name={MODEL}")
    assert code == 2
    assert (
        f"error policy.model_name = '{MODEL}' not in the job's Hugging Face cache {hub}, and "
        "the job runs with HF_HUB_OFFLINE=1: loading it would fail inside the job"
    ) in " ".join(err.split())
    assert (
        f"fix: download it where the job can read it (HF_HUB_CACHE={hub} hf download {MODEL})"
        in " ".join(err.split())
    )
    (hub / f"models--{MODEL.replace('/', '--')}" / "snapshots" / "0123abc").mkdir(parents=True)
    assert validate("grpo-tiny-1n-cpu", "--cluster", "local", f"policy.model_name={MODEL}")[0] == 0
    # the built-in tiny models and local paths are never looked up
    assert validate("grpo-tiny-1n-cpu", "--cluster", "local")[0] == 0


def test_no_cache_folder_here_is_a_warning_and_online_jobs_are_not_checked(
    validate, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "nowhere"))
    code, err = validate("grpo-tiny-1n-cpu", "--cluster", "local", f"policy.model_name={MODEL}")
    assert code == 0 and "0 errors, 1 warning" in err
    assert "does not exist on this machine" in " ".join(err.split())
    recipe = with_policy(automodel_recipe(1, 2), model_name=MODEL)
    spec = plan(recipe, local_profile(env={}), run_dir="/r", recipe_source="r", host=GOLDEN_HOST)
    assert check_models_cached(recipe, spec, {"HF_HUB_OFFLINE": "0"}) == []


def test_a_container_cache_is_looked_up_through_its_mount(tmp_path):
    hub = _cache(tmp_path / "lustre" / "hf", MODEL)
    profile = pyxis_profile(env={"HF_HOME": "/hf", "HF_HUB_OFFLINE": "1"})
    profile = attrs.evolve(profile, container=attrs.evolve(
        profile.container, mounts=(f"{tmp_path / 'lustre' / 'hf'}:/hf", "/runs:/runs")))  # fmt: skip
    recipe = with_policy(automodel_recipe(2, 8), model_name=MODEL)
    spec = plan(recipe, profile, run_dir="/runs/r", recipe_source="r", host=GOLDEN_HOST)
    assert job_hub_cache(spec, {}) == "/hf/hub"
    assert on_this_machine(spec, "/hf/hub") == hub
    assert on_this_machine(spec, "/image/only") is None
    assert check_models_cached(recipe, spec, {}) == []
    other = with_policy(recipe, model_name="org/other")
    (problem,) = check_models_cached(other, spec, {})
    assert problem.is_error and f"cache /hf/hub (here: {hub})" in problem.message


def test_a_local_jobs_python_is_asked_for_its_packages(tmp_path):
    recipe = automodel_recipe(1, 2)
    spec = plan(recipe, local_profile(), run_dir="/r", recipe_source="r", host=GOLDEN_HOST)
    here = attrs.evolve(spec, code=attrs.evolve(spec.code, python=(sys.executable,)))
    assert check_job_python(here) == []  # this venv has every job package
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    vllm = next(row for row in SUPPORTED if row.module == "vllm")
    lacking = attrs.evolve(
        here, code=attrs.evolve(spec.code, python=(str(bare / "bin" / "python"),),
                                requirements=(*spec.code.requirements, vllm)),
    )  # fmt: skip
    messages = [problem.message for problem in check_job_python(lacking)]
    assert "the job's Python lacks ray (every job needs ray>=2.49,<2.61)" in messages
    assert messages[-1] == "the job's Python lacks vllm (vLLM generation needs vllm>=0.32,<0.33)"


def test_a_local_jobs_python_with_ray_older_than_token_auth_is_refused_unless_ray_auth_none(
    tmp_path,
):
    recipe = automodel_recipe(1, 2)
    spec = plan(recipe, local_profile(), run_dir="/r", recipe_source="r", host=GOLDEN_HOST)
    old = tmp_path / "old"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(old)], check=True)
    (site,) = old.glob("lib/python3*/site-packages")
    info = site / "ray-2.49.2.dist-info"  # what NeMo RL's Ray looks like to the probe
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 2.49.2\n")
    ray_row = next(row for row in SUPPORTED if row.module == "ray")
    code = attrs.evolve(spec.code, python=(str(old / "bin" / "python"),), requirements=(ray_row,))
    (problem,) = check_job_python(attrs.evolve(spec, code=code))
    assert problem.is_error and problem.path == "python"
    assert problem.message == (
        "the job's Python has ray 2.49.2, older than Ray token authentication (ray>=2.52), "
        "which the profile's ray_auth: token (the default) needs"
    )
    assert problem.fix.startswith("install ray>=2.52 for that Python, or set ray_auth: none")
    assert check_job_python(attrs.evolve(spec, code=code, ray_auth="none")) == []


def test_validate_refuses_a_vllm_recipe_whose_local_python_lacks_vllm(validate):
    """The local profile's job Python is this one; .venv has no vLLM (.venv-vllm has)."""
    code, err = validate("grpo-tiny-vllm-1n-cpu", "--cluster", "local")
    if importlib.util.find_spec("vllm") is not None:
        assert code == 0, err
        return
    assert code == 2
    assert "the job's Python lacks vllm (vLLM generation needs vllm>=0.32,<0.33)" in " ".join(
        err.split()
    )
