"""The code bundle: what goes in, its name, writing it once and atomically, and that the job
side runs from it in a Python environment that has only an image's packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from hpcrl.job import bundle_entry
from hpcrl.plan import bundle as plan_bundle
from hpcrl.plan.bundle import (
    BASE_PACKAGES,
    _digest,
    collect_bundle,
    normalized,
    required_distributions,
)
from hpcrl.render import bundle_writer
from hpcrl.render.bundle_writer import MANIFEST_NAME, BundleChanged, write_bundle
from hpcrl.run.jobspec import CodeBundle
from tests.standin_image import build_image, image_environment

REPO = Path(__file__).resolve().parents[2]


def code_bundle(root: Path) -> CodeBundle:
    contents = collect_bundle()
    return CodeBundle(
        path=str(root / f"hpcrl-test-{contents.digest}"),
        digest=contents.digest,
        packages=contents.packages,
        extra_packages=(),
        built_from=contents.built_from,
    )


def test_contents_are_hpcrl_as_a_wheel_lays_it_out_and_the_pure_packages():
    contents = collect_bundle()
    paths = {path for path, _ in contents.files}
    for expected in (
        "hpcrl_entry.py",
        "hpcrl/__init__.py",
        "hpcrl/job/node.py",
        "hpcrl/templates/job.sbatch.sh.j2",  # mapped from templates/ (setup.cfg package_dir)
        "hpcrl/recipes/grpo-tiny-1n-cpu.yaml",
        "hpcrl/recipes/data/toy_count.jsonl",
        "hpcrl/cluster_profiles/eos.yaml",
        "submitit/core/_submit.py",
        "cattrs/__init__.py",
        "omegaconf/__init__.py",
        "yaml/__init__.py",
        "typing_extensions.py",
        "cloudpickle/__init__.py",
    ):
        assert expected in paths, expected
    assert not [p for p in paths if p.endswith((".pyc", ".so")) or "__pycache__" in p]
    assert {normalized(name) for name, _ in contents.packages} == {
        normalized(name) for name in required_distributions(BASE_PACKAGES)
    }
    assert dict(contents.packages)["submitit"] == "1.5.4"
    assert contents.problems == ()
    assert (REPO / "hpcrl" / "job" / "bundle_entry.py").read_text() == Path(
        dict(contents.files)["hpcrl_entry.py"]
    ).read_text()


def test_the_packages_follow_what_the_installed_versions_require():
    """omegaconf 2.3 requires antlr4-python3-runtime, 2.4 vendors it: a fixed list named it
    and the GPU machine's environment (omegaconf 2.4, no antlr4) could not render a bundle
    (``antlr4-python3-runtime cannot go into the code bundle``). Extras never count; a
    requirement under a marker counts when it is installed (pip installed it: the marker held)."""
    table = {
        "omegaconf": ["antlr4-python3-runtime==4.9.*", "PyYAML>=5.1.0", 'sphinx; extra == "dev"'],
        "cattrs": ["attrs>=25.4.0", "exceptiongroup>=1.1.1; python_version < '3.11'",
                   "typing-extensions>=4.14.0", "tomli>=1.1.0; python_version < '3.11'"],
        "exceptiongroup": ["typing-extensions>=4.6.0; python_version < '3.13'"],
    }  # fmt: skip
    installed = {"exceptiongroup", "typing-extensions"}
    found = required_distributions(
        ("cattrs", "omegaconf"), requires=table.get, installed=lambda name: name in installed
    )
    assert found == [
        "cattrs", "omegaconf", "attrs", "exceptiongroup", "typing-extensions",
        "antlr4-python3-runtime", "PyYAML",
    ]  # fmt: skip
    table["omegaconf"] = ["PyYAML>=5.1.0", 'PyYAML>=5.1.0; extra == "dev"']  # 2.4
    assert "antlr4-python3-runtime" not in required_distributions(
        ("omegaconf",), requires=table.get, installed=lambda name: True
    )


def test_a_bare_checkout_on_sys_path_bundles_its_shipped_folders(tmp_path):
    """``PYTHONPATH=checkout`` (as benchmarks/gpu_issue25_items356.sh runs hpcrl on the GPU
    machine) has no package mapping for ``hpcrl.templates`` and the other shipped folders:
    the bundle takes them from the checkout's root as the loader does, where it once raised
    ``No module named 'hpcrl.templates'`` (hpcrl render on a bundle profile, exit 70). ``-S``
    keeps the editable install's finder out; site-packages is added by hand for the
    dependencies."""
    import sysconfig

    code = (
        "import sys; sys.path += [sys.argv[1], sys.argv[2]]\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('hpcrl.templates') is None, 'mapping present'\n"
        "from hpcrl.plan.bundle import collect_bundle\n"
        "files = dict(collect_bundle().files)\n"
        "for path in ('hpcrl/templates/job.sbatch.sh.j2', 'hpcrl/recipes/grpo-tiny-1n-cpu.yaml',\n"
        "             'hpcrl/cluster_profiles/eos.yaml'):\n"
        "    print(path, files[path])\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", code, str(REPO), sysconfig.get_paths()["purelib"]],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"hpcrl/templates/job.sbatch.sh.j2 {REPO / 'templates' / 'job.sbatch.sh.j2'}",
        f"hpcrl/recipes/grpo-tiny-1n-cpu.yaml {REPO / 'recipes' / 'grpo-tiny-1n-cpu.yaml'}",
        f"hpcrl/cluster_profiles/eos.yaml {REPO / 'cluster_profiles' / 'eos.yaml'}",
    ]


def test_the_digest_follows_every_byte(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("x = 1\n")
    second.write_text("y = 2\n")
    files = [("pkg/a.py", str(first)), ("pkg/b.py", str(second))]
    digest = _digest(files, [])
    assert digest == _digest(list(files), []) and len(digest) == 16
    first.write_text("x = 2\n")
    assert _digest(files, []) != digest
    assert _digest([("pkg/c.py", str(first)), files[1]], []) != _digest(files, [])


def test_an_extra_pure_package_joins_the_bundle_and_changes_its_name():
    with_einops = collect_bundle(("einops",))
    assert "einops/__init__.py" in dict(with_einops.files)
    assert dict(with_einops.packages)["einops"] and with_einops.extra_packages == ("einops",)
    assert with_einops.digest != collect_bundle().digest


def test_an_extra_compiled_or_missing_package_is_refused():
    problems = dict(collect_bundle(("psutil", "no-such-distribution-here")).problems)
    assert "compiled extension modules" in problems["psutil"]
    assert "not installed" in problems["no-such-distribution-here"]


def test_written_once_read_only_and_reused(tmp_path):
    bundle = code_bundle(tmp_path)
    target = write_bundle(bundle)
    assert target == Path(bundle.path)
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    assert manifest["digest"] == bundle.digest and manifest["packages"]["submitit"] == "1.5.4"
    init = target / "hpcrl" / "__init__.py"
    assert oct(init.stat().st_mode & 0o777) == "0o444"
    assert oct(target.stat().st_mode & 0o777) == "0o755"
    written_at = init.stat().st_mtime_ns
    assert write_bundle(bundle) == target and init.stat().st_mtime_ns == written_at
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary folder left


def test_a_render_that_loses_the_race_keeps_the_winners_bundle(tmp_path, monkeypatch):
    """Two renders of the same code at once: the second rename finds the first one's
    complete folder, keeps it, and removes its own copy."""
    bundle = code_bundle(tmp_path)
    real_publish = bundle_writer._publish

    def publish_after_another_render(staging: Path, target: Path) -> None:
        monkeypatch.setattr(bundle_writer, "_publish", real_publish)
        write_bundle(bundle)  # the other render wins meanwhile
        real_publish(staging, target)

    monkeypatch.setattr(bundle_writer, "_publish", publish_after_another_render)
    target = write_bundle(bundle)
    assert (target / MANIFEST_NAME).is_file()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_plan_for_other_contents_is_not_written(tmp_path):
    bundle = attrs.evolve(code_bundle(tmp_path), digest="0000000000000000")
    with pytest.raises(BundleChanged, match="render it again"):
        write_bundle(bundle)
    assert list(tmp_path.iterdir()) == []


def test_entry_refuses_an_old_python_and_bad_usage(monkeypatch, capsys):
    monkeypatch.setattr(bundle_entry, "MIN_PYTHON", (99, 0))
    assert bundle_entry.main(["-u", "-m", "json.tool"]) == 2
    assert "hpcrl needs Python >= 99.0" in capsys.readouterr().err
    monkeypatch.setattr(bundle_entry, "MIN_PYTHON", (3, 11))
    assert bundle_entry.main(["json.tool"]) == 2
    assert "usage:" in capsys.readouterr().err


PROBE = """
import importlib, json, os, pkgutil, sys
failed, names = {}, []
for package in ("hpcrl.job", "hpcrl.core", "hpcrl.config", "hpcrl.run"):
    module = importlib.import_module(package)
    names.append(package)
    if hasattr(module, "__path__"):
        names += [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")]
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = getattr(error, "name", None) or repr(error)
import hpcrl, standin_image_marker, yaml
print(json.dumps({"failed": failed, "hpcrl": hpcrl.__file__, "path0": sys.path[0],
                  "yaml": yaml.__file__, "libyaml": yaml.__with_libyaml__,
                  "pythonpath": os.environ["PYTHONPATH"], "executable": sys.executable}))
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    return build_image(tmp_path_factory.mktemp("image") / "img")


@pytest.mark.slow
def test_the_job_side_imports_from_the_bundle_in_an_image_without_hpcrl(image, tmp_path):
    """Every module of the job side imports in the stand-in image through the entry script:
    hpcrl and its pure-Python packages from the bundle, the rest from the image. The only
    misses are packages this image leaves out on purpose: Megatron, and Triton (the image's
    CPU torch comes without it; every CUDA torch ships it, and only the opt-in decode
    kernel, hpcrl.core.generation.triton_attention, imports it)."""
    target = write_bundle(code_bundle(tmp_path / "bundles"))
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "probe_job_imports.py").write_text(PROBE)
    environ = image_environment(image, dict(os.environ))
    environ["PYTHONPATH"] += f"{os.pathsep}{probes}"
    result = subprocess.run(
        [str(image / "bin" / "python3"), str(target / "hpcrl_entry.py"), "-u", "-m",
         "probe_job_imports"],
        capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert set(found["failed"].values()) <= {"megatron", "triton"}, found["failed"]
    assert found["hpcrl"] == f"{target}/hpcrl/__init__.py"
    # PyYAML from the bundle, without its C extension (never copied: the image's Python may
    # be another version), falls back to pure Python.
    assert found["yaml"] == f"{target}/yaml/__init__.py" and found["libyaml"] is False
    assert found["path0"] == str(target) and found["executable"] == str(image / "bin" / "python3")
    # The image's own PYTHONPATH stays, behind the bundle (a plain export would lose one).
    assert (
        found["pythonpath"]
        == f"{target}{os.pathsep}{image / 'image-pythonpath'}{os.pathsep}{probes}"
    )


def test_the_image_lacks_what_the_bundle_brings(image, tmp_path):
    """The stand-in really is another environment: its python3 has torch and Ray but not
    hpcrl, submitit, cattrs or omegaconf."""
    from tests.standin_image import imports_in

    found = imports_in(
        image, ("torch", "ray", "hpcrl", "submitit", "cattrs", "omegaconf"), tmp_path
    )
    assert found == {"torch": True, "ray": True, "hpcrl": False, "submitit": False,
                     "cattrs": False, "omegaconf": False}  # fmt: skip
    assert sys.executable != str(image / "bin" / "python3")


def test_the_checkout_sha_takes_one_git_process_and_says_what_two_said(tmp_path, monkeypatch):
    """``hpcrl_git_sha`` reads HEAD and whether tracked files changed from one ``git status
    --porcelain=v2 --branch`` (one process start per validate, not two); the same answers as
    ``rev-parse HEAD`` + ``status --porcelain``, which a git without porcelain v2 still gets."""
    package = tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "module.py").write_text("x = 1\n")
    git = ["git", "-C", str(tmp_path / "repo"), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert plan_bundle.checkout_git_sha(package) is None  # no commit yet
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    calls: list[tuple[str, ...]] = []
    real_git = plan_bundle._git
    monkeypatch.setattr(
        plan_bundle, "_git", lambda *args: calls.append(args[1:]) or real_git(*args)
    )
    (package / "untracked.py").write_text("y = 2\n")  # untracked: not a change of the code
    assert plan_bundle.checkout_git_sha(package) == head
    assert len(calls) == 1
    assert plan_bundle._git_sha_two_calls(package) == head
    (package / "module.py").write_text("x = 3\n")
    assert plan_bundle.checkout_git_sha(package) == f"{head}-dirty"
    assert plan_bundle._git_sha_two_calls(package) == f"{head}-dirty"
    # a git that refuses porcelain v2 (older than 2.11): the two questions of before
    monkeypatch.setattr(
        plan_bundle, "_git", lambda *args: None if "--porcelain=v2" in args else real_git(*args)
    )
    assert plan_bundle.checkout_git_sha(package) == f"{head}-dirty"
    assert plan_bundle.checkout_git_sha(tmp_path / "site-packages" / "pkg") is None
