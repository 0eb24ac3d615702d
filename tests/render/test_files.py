"""hpcrl.run.atomic_files: atomic writes through exclusive temporary files, the umask, the run-folder lock."""

from __future__ import annotations

import errno
import multiprocessing
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from hpcrl.config.errors import UserError
from hpcrl.run.atomic_files import SecretInRunFile, write_file
from hpcrl.run.folder_lock import LOCK_NAME, RunFolderBusy, run_folder_lock, unusable_folder
from hpcrl.run.jobspec_file import read_jobspec
from tests.plan.planning_inputs import isolate_from_user_profiles
from tests.require import unavailable


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask077():
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_write_replaces_the_file_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "job.json"
    target.write_text("old")
    write_file(target, "new\n")
    assert target.read_text() == "new\n"
    assert [path.name for path in tmp_path.iterdir()] == ["job.json"]


def test_modes_follow_the_umask_and_are_never_widened(tmp_path, umask077):
    write_file(tmp_path / "manifest.json", "{}")
    write_file(tmp_path / "job.sbatch", "#!/bin/bash\n", executable=True)
    assert mode_of(tmp_path / "manifest.json") == 0o600
    assert mode_of(tmp_path / "job.sbatch") == 0o700
    # A file that existed wider is replaced by one the umask allows.
    wide = tmp_path / "recipe.resolved.yaml"
    wide.write_text("x")
    wide.chmod(0o666)
    write_file(wide, "y")
    assert mode_of(wide) == 0o600


def test_a_umask_077_user_gets_a_run_folder_no_one_else_can_read(
    tmp_path, monkeypatch, capsys, umask077
):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    assert main(["render", "grpo-tiny-2n-cpu", "--cluster", "slurm-test", "-o", "run"]) == 0
    written = [path for path in (tmp_path / "run").rglob("*") if not path.is_symlink()]
    assert {path.name for path in written} >= {"job.sbatch", "recipe.resolved.yaml",
                                                "manifest.json", "jobspec.json", "ray_token"}  # fmt: skip
    assert [str(p) for p in written + [tmp_path / "run"] if mode_of(p) & 0o077] == []


def test_default_umask_gives_the_usual_modes(tmp_path):
    old = os.umask(0o022)
    try:
        write_file(tmp_path / "a", "x")
        write_file(tmp_path / "b", "x", executable=True)
    finally:
        os.umask(old)
    assert (mode_of(tmp_path / "a"), mode_of(tmp_path / "b")) == (0o644, 0o755)


def test_a_symlink_planted_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o600)
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.sbatch").symlink_to(victim)
    write_file(run / "job.sbatch", "script", executable=True)
    assert victim.read_text() == "precious" and mode_of(victim) == 0o600
    assert not (run / "job.sbatch").is_symlink()
    assert (run / "job.sbatch").read_text() == "script"


def test_symlinks_planted_at_temporary_names_are_never_followed(tmp_path, monkeypatch):
    """The temporary name is drawn at random; here the first draws are forced onto names
    where symlinks wait, which O_EXCL|O_NOFOLLOW refuses, so another name is drawn."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    names = iter(["planted", "planted", "fresh"])
    monkeypatch.setattr("hpcrl.run.atomic_files.secrets.token_hex", lambda _: next(names))
    (run / ".job.sbatch.planted.tmp").symlink_to(victim)
    write_file(run / "job.sbatch", "script")
    assert victim.read_text() == "precious"
    assert (run / "job.sbatch").read_text() == "script"
    assert (run / ".job.sbatch.planted.tmp").is_symlink()  # left alone, never written through


def _write_many(path: str, marker: str, count: int) -> None:
    for index in range(count):
        write_file(Path(path), f"{marker} {index}\n" * 200)


def test_concurrent_writers_never_collide_and_readers_never_see_half_a_file(tmp_path):
    target = tmp_path / "job.json"
    write_file(target, "start\n")
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_write_many, args=(str(target), name, 40)) for name in ("a", "b")
    ]
    for writer in writers:
        writer.start()
    seen = set()
    while any(writer.is_alive() for writer in writers):
        lines = set(target.read_text().splitlines())
        assert len(lines) == 1, "a reader saw a mix of two writes"
        seen |= lines
    assert all(writer.exitcode == 0 for writer in writers)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.json"]


def test_text_holding_a_secret_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fromtheshell_0123456789")
    with pytest.raises(SecretInRunFile, match=r"\$HF_TOKEN"):
        write_file(tmp_path / "manifest.json", '{"name": "hf_fromtheshell_0123456789"}')
    assert not list(tmp_path.iterdir())


def test_the_lock_serialises_two_holders_and_names_the_holder(tmp_path):
    folder = tmp_path / "run"
    entered = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with run_folder_lock(folder, command="hpcrl render"):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(10)
    with pytest.raises(RunFolderBusy, match=r"another hpcrl command \(hpcrl render \(pid \d+\)\)"):
        with run_folder_lock(folder, timeout_s=0.3):
            pass
    release.set()
    holder.join()
    with run_folder_lock(folder, timeout_s=0.3):
        assert (folder / LOCK_NAME).is_file()


@pytest.mark.parametrize(
    "make_out, reason",
    [
        (lambda tmp: tmp / "a-file", "is a file, not a folder"),
        (lambda tmp: tmp / "a-file" / "below", "is a file, not a folder"),
        (lambda tmp: Path("/proc/hpcrl-run"), "does not let hpcrl create it"),
    ],
    ids=["onto-a-file", "under-a-file", "proc"],
)
def test_render_onto_an_unusable_folder_is_one_line(
    tmp_path, monkeypatch, capsys, make_out, reason
):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    (tmp_path / "a-file").write_text("x")
    out = make_out(tmp_path)
    code = main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1, err
    assert f"hpcrl render: error: {out}: cannot be used as a run folder" in err
    assert reason in err and "fix: choose a writable folder with -o/--out" in err


def test_render_into_an_immutable_folder_is_one_line(tmp_path, monkeypatch, capsys):
    """``chattr +i``: a folder that not even root may write into."""
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    folder = tmp_path / "immutable"
    folder.mkdir()
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if made.returncode != 0:
        unavailable("deps", f"chattr +i is refused here ({made.stderr.strip()}): e2fsprogs on ext4")
    try:
        code = main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", str(folder / "run")])
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert f"{folder / 'run'}: cannot be used as a run folder: Operation not permitted" in err
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    "error, reason",
    [
        (PermissionError(errno.EACCES, "Permission denied", "/ro/run"), "Permission denied"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/run"), "Read-only file system"),
        (OSError(errno.EPERM, "Operation not permitted", "/ro"), "Operation not permitted (/ro)"),
    ],
)
def test_why_a_folder_is_unusable(error, reason):
    """Read-only and immutable folders (root, as CI runs, ignores permission bits, so the
    errors such folders give are built here)."""
    assert unusable_folder(Path("/ro/run"), error).one_line() == (
        f"/ro/run: cannot be used as a run folder: {reason} "
        "(fix: choose a writable folder with -o/--out)"
    )


def test_user_error_is_one_line_with_the_fix():
    assert UserError("a: b", fix="c").one_line() == "a: b (fix: c)"


def _render_into(out: str, steps: int, results: multiprocessing.Queue) -> None:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", out,
                     f"grpo.max_num_steps={steps}"])  # fmt: skip
    results.put(code)


def test_two_renders_of_one_folder_at_once_both_succeed_one_after_the_other(tmp_path, monkeypatch):
    """What raced on a fixed ``*.tmp`` name (FileNotFoundError) now takes turns on the lock;
    the folder ends up holding one render's files, whole."""
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    renders = [
        context.Process(target=_render_into, args=(str(tmp_path / "run"), steps, results))
        for steps in (3, 4)
    ]
    for render in renders:
        render.start()
    for render in renders:
        render.join(120)
    assert sorted(results.get(timeout=5) for _ in renders) == [0, 0]
    steps = {
        name: next(line for line in (tmp_path / "run" / name).read_text().splitlines()
                   if "max_num_steps" in line)
        for name in ("recipe.resolved.yaml", "manifest.json")
    }  # fmt: skip
    assert steps["recipe.resolved.yaml"].strip()[-1] == steps["manifest.json"].strip()[-2]
    plan = read_jobspec(tmp_path / "run")  # the plan is that same render's, and whole
    assert f"grpo.max_num_steps={steps['recipe.resolved.yaml'].strip()[-1]}" in plan.written_by
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        ".hpcrl.lock", "auth", "job.sbatch", "jobspec.json", "manifest.json",
        "recipe.resolved.yaml",
    ]  # fmt: skip
