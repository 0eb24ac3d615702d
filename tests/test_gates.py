"""The one require mechanism (tests/require.py): a missing dependency skips locally and fails
under CI, for every kind; the Slurm cluster's loopback fallback fails under CI; the CI test
command refuses to skip the vLLM environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import require
from tests.slurm import harness

REPO_ROOT = Path(__file__).resolve().parents[1]
CI_VARIABLES = ("CI", *require.FLAGS.values())


@pytest.fixture
def no_ci(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("kind", sorted(require.FLAGS))
def test_missing_piece_skips_locally_and_fails_under_its_flag(no_ci, kind):
    with pytest.raises(pytest.skip.Exception, match="thing is missing"):
        require.unavailable(kind, "thing is missing")
    no_ci.setenv(require.FLAGS[kind], "1")
    with pytest.raises(
        pytest.fail.Exception, match=f"{require.FLAGS[kind]}=1 but thing is missing"
    ):
        require.unavailable(kind, "thing is missing")


@pytest.mark.parametrize("value", ["true", "1", "True"])
def test_ci_variable_requires_everything_but_a_gpu(no_ci, value):
    no_ci.setenv("CI", value)
    assert {kind for kind in require.FLAGS if require.is_required(kind)} == {
        "deps",
        "slurm",
        "vllm",
    }
    with pytest.raises(pytest.fail.Exception, match="CI is set but no ray"):
        require.unavailable("deps", "no ray")
    no_ci.setenv("CI", "false")
    assert not any(require.is_required(kind) for kind in require.FLAGS)


def test_missing_module_fails_under_ci_and_names_the_module(no_ci):
    with pytest.raises(pytest.skip.Exception, match="no_such_package_hpcrl cannot be imported"):
        require.require_module("no_such_package_hpcrl")
    no_ci.setenv("HPCRL_REQUIRE_DEPS", "1")
    with pytest.raises(pytest.fail.Exception, match="no_such_package_hpcrl cannot be imported"):
        require.require_module("no_such_package_hpcrl")
    assert require.require_module("json").dumps([]) == "[]"


def test_megatron_marker_gate_names_what_is_missing(no_ci, monkeypatch):
    monkeypatch.setattr(require, "MEGATRON_PACKAGES", ("megatron.core", "megatron.no_such_part"))
    no_ci.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="megatron.no_such_part not installed"):
        require.require_megatron()


def test_loopback_cluster_fails_under_ci(no_ci, monkeypatch, tmp_path):
    (tmp_path / "mode").write_text("loopback\n")
    monkeypatch.setenv("HPCRL_SLURM_ROOT", str(tmp_path))
    monkeypatch.setattr(harness, "_cluster_problem", lambda: None)  # sinfo says all is well
    harness.require_slurm()  # locally the fallback is usable
    with pytest.raises(pytest.skip.Exception, match="needs the netns test cluster"):
        harness.require_netns_cluster("this check")
    no_ci.setenv("HPCRL_REQUIRE_SLURM", "1")
    with pytest.raises(pytest.fail.Exception, match="runs in 'loopback' mode, not 'netns'"):
        harness.require_slurm()


@pytest.mark.parametrize("ci_setting", [("CI", "true"), ("HPCRL_REQUIRE_DEPS", "1")])
def test_ci_test_command_refuses_to_skip_vllm(no_ci, ci_setting):
    no_ci.setenv("HPCRL_SKIP_VLLM", "1")
    no_ci.setenv(*ci_setting)
    # Refused before it builds anything, so this takes no time.
    result = subprocess.run(
        ["bash", str(REPO_ROOT / ".ci" / "test")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2, result.stderr
    assert "HPCRL_SKIP_VLLM=1 is refused under CI" in result.stderr


def test_ci_entry_point_sets_every_require_flag_but_gpu():
    lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    exported = {
        word.split("=")[0]
        for line in lines
        if line.startswith("export ")
        for word in line.split()[1:]
        if word.endswith("=1")
    }
    assert exported == set(require.FLAGS.values()) - {"HPCRL_REQUIRE_GPU"}


def test_no_test_skips_around_the_gate():
    """A skip for a missing dependency goes through tests/require.py, so CI can fail it."""
    bypasses = ("importorskip", "pytest.skip(", "skipif(", "mark.skip")
    found = [
        f"{path.relative_to(REPO_ROOT)}: {word}"
        for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
        if path.name not in ("require.py", "test_gates.py")
        for word in bypasses
        if word in path.read_text()
    ]
    assert found == [], "use require_module()/unavailable() from tests/require.py instead"


def test_the_type_checker_covers_all_of_hpcrl_and_holds_the_run_contract_strictly():
    """CI's `.venv/bin/mypy` (no arguments: .ci/test) checks what pyproject names: every
    module of hpcrl, and hpcrl/run with each flag of mypy --strict that a module may set.
    `strict = true` in an overrides section would switch strict on for every module (mypy
    reads it as the global flag), so the flags are listed one by one."""
    import tomllib

    assert 'timed "mypy" .venv/bin/mypy ||' in (REPO_ROOT / ".ci" / "test").read_text()
    mypy = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["hpcrl"]
    assert mypy["warn_unused_ignores"] and mypy["warn_redundant_casts"]
    (run,) = [o for o in mypy["overrides"] if "hpcrl.run.*" in o["module"]]
    per_module_strict = {
        "disallow_any_generics": True,
        "disallow_subclassing_any": True,
        "disallow_untyped_calls": True,
        "disallow_untyped_defs": True,
        "disallow_incomplete_defs": True,
        "disallow_untyped_decorators": True,
        "warn_return_any": True,
        "implicit_reexport": False,
        "strict_equality": True,
        "extra_checks": True,
    }
    assert {key: run.get(key) for key in per_module_strict} == per_module_strict
    assert not any("strict" in override for override in mypy["overrides"])
    assert "hpcrl" not in {m.split(".")[0] for o in mypy["overrides"] if o.get("ignore_errors")
                           for m in o["module"]}  # fmt: skip
