"""The job's Ray token: its file (modes, content, one per folder, reuse) and the environment
every Ray process and the driver get; the private folder of Ray's files on each node. No Ray
is started here: the live checks are in test_ray_auth_live.py."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from hpcrl.job.ray_auth import (
    RayDirUnusable,
    RayTokenUnusable,
    make_private_ray_dir,
    prepare_job_token,
)
from hpcrl.job.ray_cluster import ray_environment
from hpcrl.job.settings import read_node_settings
from hpcrl.run.jobspec import token_path
from hpcrl.run.ray_token import TokenFileError, ensure_token_file, token_file_problem
from tests.job.plans import write_node_plan


def slurm_env(rank: int) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "4242", "SLURM_NODEID": str(rank), "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "localhost,localhost", "SLURMD_NODENAME": "localhost",
    }  # fmt: skip


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o377])
def test_token_file_is_private_whatever_the_umask(tmp_path, umask):
    path = tmp_path / "run" / "auth" / "ray_token"
    previous = os.umask(umask)
    try:
        assert ensure_token_file(path) == path
    finally:
        os.umask(previous)
    assert (mode_of(path.parent), mode_of(path)) == (0o700, 0o600)
    text = path.read_text()
    assert len(text) == 65 and text.endswith("\n") and int(text, 16) > 0  # 32 random bytes, hex
    assert sorted(p.name for p in path.parent.iterdir()) == ["ray_token"]  # no temp file left


def test_an_existing_token_is_kept_and_each_folder_gets_its_own(tmp_path):
    first = ensure_token_file(tmp_path / "a" / "auth" / "ray_token").read_text()
    assert ensure_token_file(tmp_path / "a" / "auth" / "ray_token").read_text() == first
    assert ensure_token_file(tmp_path / "b" / "auth" / "ray_token").read_text() != first


def _create(path: str, queue) -> None:
    queue.put(ensure_token_file(path).read_text())


def test_concurrent_creators_end_with_one_token(tmp_path):
    path = str(tmp_path / "auth" / "ray_token")
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    creators = [context.Process(target=_create, args=(path, queue)) for _ in range(6)]
    for creator in creators:
        creator.start()
    tokens = {queue.get(timeout=60) for _ in creators}
    for creator in creators:
        creator.join(timeout=60)
    assert [creator.exitcode for creator in creators] == [0] * 6
    assert tokens == {open(path).read()}


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (lambda p: p.chmod(0o640), "has mode 0640: others could reach the job's Ray token"),
        (lambda p: p.parent.chmod(0o750), "has mode 0750: others could reach the job's Ray token"),
        (lambda p: p.write_text("hunter2\n"), "does not hold a token"),
        (lambda p: (p.unlink(), p.symlink_to(p.parent / "elsewhere")), "is not a plain file"),
    ],
)
def test_a_spoiled_token_file_is_refused_with_the_cause(tmp_path, spoil, expected):
    path = ensure_token_file(tmp_path / "auth" / "ray_token")
    spoil(path)
    assert expected in token_file_problem(path)
    with pytest.raises(TokenFileError, match=expected):
        ensure_token_file(path)


def test_ray_gets_the_token_path_and_never_an_inherited_token(tmp_path):
    inherited = {
        "PATH": "/bin", "RAY_AUTH_TOKEN": "from-the-submitting-shell",
        "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": "/home/u/.ray/other",
    }  # fmt: skip
    write_node_plan(tmp_path, num_nodes=2)
    env = ray_environment(inherited, read_node_settings(tmp_path, slurm_env(0)))
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path.resolve() / "auth" / "ray_token")
    assert "RAY_AUTH_TOKEN" not in env  # Ray would prefer it to the file
    assert env["PATH"] == "/bin"


def test_opting_out_turns_ray_auth_off_explicitly(tmp_path):
    write_node_plan(tmp_path, num_nodes=2, ray_auth="none")
    settings = read_node_settings(tmp_path, slurm_env(0))
    env = ray_environment({"RAY_AUTH_TOKEN_PATH": "/x", "RAY_AUTH_TOKEN": "y"}, settings)
    # Ray 2.60 turns token auth on by itself when ~/.ray/auth_token exists, unless told not to.
    assert env["RAY_AUTH_MODE"] == "disabled"
    assert "RAY_AUTH_TOKEN_PATH" not in env and "RAY_AUTH_TOKEN" not in env
    prepare_job_token(settings)
    assert not (tmp_path / "auth").exists()


def test_node_0_creates_a_missing_token_and_the_others_only_read_it(tmp_path):
    write_node_plan(tmp_path, num_nodes=2)
    worker = read_node_settings(tmp_path, slurm_env(1))
    with pytest.raises(RayTokenUnusable, match="cannot use the job's Ray token: .* does not exist"):
        prepare_job_token(worker)
    assert not (tmp_path / "auth" / "ray_token").exists()  # a worker never creates one

    prepare_job_token(read_node_settings(tmp_path, slurm_env(0)))
    token = (tmp_path / "auth" / "ray_token").read_text()
    prepare_job_token(worker)
    prepare_job_token(read_node_settings(tmp_path, slurm_env(0)))  # a later attempt reuses it
    assert (tmp_path / "auth" / "ray_token").read_text() == token
    assert token_path(str(tmp_path)) == str(tmp_path / "auth" / "ray_token")

    (tmp_path / "auth" / "ray_token").chmod(0o644)
    with pytest.raises(RayTokenUnusable, match="mode 0644"):
        prepare_job_token(worker)


def test_rays_folder_is_private_and_emptied_before_each_start(tmp_path):
    write_node_plan(tmp_path / "run", num_nodes=2)
    settings = read_node_settings(
        tmp_path / "run", slurm_env(0) | {"HPCRL_RAY_TEMP_ROOT": str(tmp_path)}
    )
    private = Path(settings.ray_private_dir)
    assert settings.ray_temp_dir == f"{private}/ray"  # Ray makes this one (and all inside) 0777
    private.mkdir(mode=0o777)
    (private / "stale").write_text("an earlier crash's")
    make_private_ray_dir(settings)
    assert (mode_of(private), list(private.iterdir())) == (0o700, [])


def test_a_folder_planted_under_rays_predictable_name_is_refused(tmp_path):
    write_node_plan(tmp_path / "run", num_nodes=2)
    settings = read_node_settings(
        tmp_path / "run", slurm_env(0) | {"HPCRL_RAY_TEMP_ROOT": str(tmp_path)}
    )
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir(mode=0o777)
    Path(settings.ray_private_dir).symlink_to(elsewhere)
    with pytest.raises(
        RayDirUnusable, match="cannot keep Ray's files private: .* is not a plain folder"
    ):
        make_private_ray_dir(settings)
