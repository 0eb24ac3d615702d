"""The job's Ray token in the run folder (written with it, private, nowhere else) and what the
script and the commands say about authentication."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from hpcrl.config.errors import ConfigError
from hpcrl.plan.planner import plan
from hpcrl.render.run_folder import write_run_folder
from hpcrl.render.script import render_sbatch
from tests.plan.planning_inputs import isolate_from_user_profiles, plain_slurm_profile
from tests.recipe_builder import automodel_recipe

REPO = Path(__file__).resolve().parents[2]
NO_AUTH_PROFILE = (REPO / "cluster_profiles" / "slurm-test.yaml").read_text().replace(
    "name: slurm-test", "name: open-test"
) + "ray_auth: none\n"


def planned(run_dir: Path, **profile_changes):
    return plan(
        automodel_recipe(num_nodes=1, gpus_per_node=2), plain_slurm_profile(**profile_changes),
        run_dir=str(run_dir), recipe_source="recipes/x.yaml",
    )  # fmt: skip


def files_holding(folder: Path, text: str) -> list[str]:
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and text.encode() in path.read_bytes()
    )


def test_the_run_folder_gets_a_private_token_that_nothing_else_contains(tmp_path):
    spec = planned(tmp_path / "run")
    run = write_run_folder(spec, {"policy": {}}, recipe_path=None)

    token_file = run.path / "auth" / "ray_token"
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) == 64
    assert files_holding(run.path, token) == ["auth/ray_token"]
    script = run.script.read_text()
    assert (
        "# Ray admits only this job: every node and the driver present the token in\n"
        f"#   {token_file} (mode 0600; never in this script).\n"
    ) in script
    # Rendering the folder again (nothing submitted yet) keeps the token the job will use.
    write_run_folder(spec, {"policy": {}}, recipe_path=None)
    assert token_file.read_text().strip() == token


def test_opting_out_writes_no_token_and_the_script_says_so(tmp_path):
    spec = planned(tmp_path / "run", ray_auth="none")
    run = write_run_folder(spec, {}, recipe_path=None)
    assert not (run.path / "auth").exists()
    assert "# Ray runs WITHOUT authentication (profile ray_auth: none)" in run.script.read_text()


def test_an_array_folder_gets_no_token_of_its_own(tmp_path):
    spec = plan(
        automodel_recipe(num_nodes=1, gpus_per_node=2), plain_slurm_profile(),
        run_dir=str(tmp_path / "sweep"), recipe_source="recipes/x.yaml", array_size=3,
    )  # fmt: skip
    write_run_folder(spec, {}, recipe_path=None)
    assert not (tmp_path / "sweep" / "auth").exists()
    assert "present the token in\n#   <point-i>/auth/ray_token (mode 0600" in render_sbatch(spec)


def test_a_folder_that_would_expose_the_token_is_refused_before_submission(tmp_path):
    (tmp_path / "run" / "auth").mkdir(parents=True)
    os.chmod(tmp_path / "run" / "auth", 0o755)  # say, made by hand or a group-shared umask
    with pytest.raises(ConfigError) as caught:
        write_run_folder(planned(tmp_path / "run"), {}, recipe_path=None)
    (problem,) = caught.value.problems
    assert problem.path == "run_dir"
    assert "cannot keep the job's Ray token private here" in problem.message
    assert "has mode 0755: others could reach the job's Ray token" in problem.message
    assert not (tmp_path / "run" / "auth" / "ray_token").exists()


@pytest.fixture
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("HPCRL_CLUSTER_PROFILES", str(tmp_path / "profiles"))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "open-test.yaml").write_text(NO_AUTH_PROFILE)
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    return tmp_path


@pytest.mark.parametrize("command", ["validate", "render", "show"])
def test_every_planning_command_warns_when_auth_is_off(in_tmp, capsys, command):
    assert main([command, "grpo-tiny-2n-cpu", "--cluster", "open-test"]) == 0
    err = capsys.readouterr().err
    assert "profile[open-test].ray_auth" in err
    assert "Ray token authentication is off" in err and "run code as you" in err
    assert main([command, "grpo-tiny-2n-cpu", "--cluster", "slurm-test"]) == 0
    assert "ray_auth" not in capsys.readouterr().err


def test_a_render_stopped_after_the_token_can_be_rendered_again(in_tmp):
    """The token is the first thing a render writes: a folder holding only it is one of
    hpcrl's (hpcrl.run.folder_lock.RENDER_NAMES), not a foreign folder to refuse, and keeps its token."""
    from hpcrl.run.folder_lock import RENDER_NAMES
    from hpcrl.run.jobspec import AUTH_DIR_NAME

    assert AUTH_DIR_NAME in RENDER_NAMES
    run = in_tmp / "run"
    assert main(["render", "grpo-tiny-2n-cpu", "--cluster", "slurm-test", "-o", str(run)]) == 0
    token = (run / "auth" / "ray_token").read_text()
    for path in run.iterdir():  # what an interrupted first render leaves: the token alone
        if path.name != "auth":
            path.unlink()
    assert [path.name for path in run.iterdir()] == ["auth"]
    assert main(["render", "grpo-tiny-2n-cpu", "--cluster", "slurm-test", "-o", str(run)]) == 0
    assert (run / "auth" / "ray_token").read_text() == token
    assert (run / "manifest.json").is_file()


def test_sweep_points_each_get_their_own_token_and_opting_out_is_warned(in_tmp, capsys):
    grid = ["--grid", "grpo.seed=1,2", "--no-submit"]
    assert (
        main(["sweep", "recipes/grpo-tiny-2n-cpu.yaml", "-c", "slurm-test", *grid, "-o", "a"]) == 0
    )
    tokens = {(in_tmp / "a" / f"point-{i}/auth/ray_token").read_text() for i in range(2)}
    assert len(tokens) == 2
    assert not (in_tmp / "a" / "auth").exists()
    assert "ray_auth" not in capsys.readouterr().err

    assert (
        main(["sweep", "recipes/grpo-tiny-2n-cpu.yaml", "-c", "open-test", *grid, "-o", "b"]) == 0
    )
    assert "Ray token authentication is off" in capsys.readouterr().err
    assert not list((in_tmp / "b").rglob("auth"))


@pytest.mark.slurm
def test_submit_warns_before_it_submits(in_tmp, capsys):
    """A partition Slurm does not have makes sbatch refuse at once: the warning came first."""
    profile = NO_AUTH_PROFILE.replace("name: open-test", "name: nowhere").replace(
        "partition: debug", "partition: no-such-partition"
    )
    (in_tmp / "profiles" / "nowhere.yaml").write_text(profile)
    code = main(["submit", "grpo-tiny-2n-cpu", "--cluster", "nowhere", "-o", "run"])
    captured = capsys.readouterr()
    # The refusal goes to stderr, after the warning that was printed before sbatch ran.
    assert code == 1 and "not submitted" in captured.err
    warned_at = captured.err.index("profile[nowhere].ray_auth")
    assert warned_at < captured.err.index("not submitted")
    assert "Ray token authentication is off" in captured.err
    assert not (in_tmp / "run" / "auth").exists()
