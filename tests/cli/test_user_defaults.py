"""The user's defaults (issue 26 item 8): a default cluster ($HPCRL_CLUSTER, else ``cluster:``
in ~/.config/hpcrl/config.yaml), a runs root that ``status`` and new runs share
($HPCRL_RUNS_DIR, else ``runs_dir:`` there, else ./runs), and ``rerun`` naming its folder
after the source run and keeping its recipe's git SHA. At 167264e --cluster was required,
status looked only in ./runs, and a rerun got a hash-named folder and no SHA."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hpcrl.cli.again import prepare_rerun
from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles

RECIPE = "grpo-tiny-1n-cpu"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)  # XDG_CONFIG_HOME: tmp/no-user-config
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


def _config(home: Path, text: str) -> Path:
    path = home / "no-user-config" / "hpcrl" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_without_cluster_the_command_says_where_a_default_goes(home, capsys):
    assert main(["validate", RECIPE]) == 1
    assert capsys.readouterr().err == (
        "hpcrl validate: error: no cluster profile: give --cluster PROFILE (fix: or set a "
        f"default: export HPCRL_CLUSTER=NAME, or 'cluster: NAME' in "
        f"{home / 'no-user-config' / 'hpcrl' / 'config.yaml'})\n"
    )


def test_the_default_cluster_comes_from_the_environment_then_the_config_file(
    home, capsys, monkeypatch
):
    _config(home, "cluster: no-such-profile\n")
    monkeypatch.setenv("HPCRL_CLUSTER", "local")  # the environment wins over the file
    assert main(["render", RECIPE, "-o", "runs/a"]) == 0
    header = (home / "runs" / "a" / "job.sbatch").read_text()
    assert f"# Written by: hpcrl render {RECIPE} --cluster local" in header
    monkeypatch.delenv("HPCRL_CLUSTER")
    _config(home, "cluster: local\n")
    assert main(["validate", RECIPE]) == 0
    assert "plans on local" in capsys.readouterr().out


def test_runs_go_to_and_status_finds_them_in_the_configured_runs_root(home, capsys, monkeypatch):
    root = home / "lustre" / "me" / "runs"
    _config(home, f"cluster: local\nruns_dir: {root}\n")
    assert main(["render", RECIPE]) == 0
    # the run folder, and the runs' shared compile cache beside it (docs/jobs.md)
    run, cache = sorted(root.iterdir(), key=lambda path: path.name.startswith("."))
    assert run.name.startswith("grpo-tiny-1n-cpu-local-") and cache.name == ".hpcrl-cache"
    capsys.readouterr()
    assert main(["status", "--json"]) == 0  # run from another folder than the root's parent
    assert [entry["path"] for entry in json.loads(capsys.readouterr().out)] == [str(run)]
    monkeypatch.setenv("HPCRL_RUNS_DIR", str(home / "elsewhere"))  # the variable wins
    assert main(["status"]) == 0
    assert (
        capsys.readouterr().out
        == f"No runs under {home / 'elsewhere'}/ (submit one with: hpcrl submit RECIPE --cluster C)\n"
    )


@pytest.mark.parametrize(
    "text, said",
    [("clster: local\n", "unknown key(s) clster (fix: the keys are: cluster, runs_dir)"),
     ("cluster: [a, b]\n", "cluster must be text (a profile name, a folder)"),
     ("cluster: local\n  bad: [\n", "not YAML")],
)  # fmt: skip
def test_a_config_file_hpcrl_cannot_use_is_an_error_naming_it(home, capsys, text, said):
    path = _config(home, text)
    assert main(["validate", RECIPE]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"hpcrl validate: error: {path}: ") and said in err, err


def _rerun_args(run: Path, *overrides: str) -> argparse.Namespace:
    return argparse.Namespace(run=str(run), overrides=list(overrides), cluster=None, out=None)


def test_a_rerun_is_named_after_its_run_and_keeps_its_recipe_commit(home, capsys):
    assert main(["render", RECIPE, "--cluster", "local", "-o", "runs/demo"]) == 0
    source = json.loads((home / "runs" / "demo" / "manifest.json").read_text())
    assert len(source["recipe_git_sha"]) == 40  # the shipped recipe lives in this checkout
    prepared = prepare_rerun(_rerun_args(home / "runs" / "demo", "grpo.max_num_steps=2"))
    assert prepared.spec.run_dir == str(home / "runs" / "demo-rerun")
    assert prepared.provenance["recipe_git_sha"] == source["recipe_git_sha"]
    assert prepared.spec.written_by == (
        "hpcrl", "rerun", str(home / "runs" / "demo"), "grpo.max_num_steps=2"
    )  # fmt: skip
    (home / "runs" / "demo-rerun").mkdir()
    (home / "runs" / "demo-rerun" / "job.json").write_text("{}")  # that one was submitted
    again = prepare_rerun(_rerun_args(home / "runs" / "demo"))
    assert again.spec.run_dir == str(home / "runs" / "demo-rerun-2")
    assert again.spec.written_by[-2:] == ("-o", str(home / "runs" / "demo-rerun-2"))
    from hpcrl.render.run_folder import build_manifest

    manifest = build_manifest(again.spec, recipe_path=None, provenance=again.provenance)
    assert manifest["recipe_git_sha"] == source["recipe_git_sha"]
    assert manifest["rerun_of"] == str(home / "runs" / "demo")


def test_a_sweep_points_rerun_goes_beside_the_sweep(home):
    assert main(["sweep", RECIPE, "--cluster", "local", "--grid", "grpo.seed=1,2", "-o",
                 "runs/sw", "--no-submit"]) == 0  # fmt: skip
    prepared = prepare_rerun(_rerun_args(home / "runs" / "sw" / "point-1"))
    assert prepared.spec.run_dir == str(home / "runs" / "sw-point-1-rerun")
