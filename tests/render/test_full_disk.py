"""A full disk while a run folder is written (issue 26): the command says "no space left on
<folder>" and leaves nothing behind (it used to say the folder "does not keep file modes" and
leave an empty token temp file, or an empty lock file after ``submit``).

A real filesystem fills up here: a 64 KiB tmpfs mounted for the test (root only), with all
but ``free`` of its 4 KiB pages taken, so each case fails at another write (the lock, the
token, the script, ...)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles
from tests.require import unavailable
from tests.robust.harness import write_scheduler_standins

PAGE = 4096
SIZE = 16 * PAGE


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        unavailable("deps", "mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        unavailable("deps", f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(disk: Path, free_pages: int) -> None:
    (disk / "filler").write_bytes(b"\0" * (SIZE - free_pages * PAGE))


def fill_up(disk: Path) -> None:
    """Take every page left (what a run folder leaves free is not known in advance)."""
    with open(disk / "filler", "ab", buffering=0) as stream:
        try:
            while True:
                stream.write(b"\0" * PAGE)
        except OSError:
            pass


def left_on(disk: Path) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if p.name != "filler")


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    standins = write_scheduler_standins(tmp_path / "bin", "empty")  # sbatch refuses
    monkeypatch.setenv("PATH", f"{standins}:/usr/bin:/bin")

    def run(*argv: str) -> tuple[int, str]:
        code = main(list(argv))
        return code, " ".join(capsys.readouterr().err.split())

    return run


def no_space(command: str, run: Path) -> str:
    return (
        f"hpcrl {command}: error: no space left on {run} (the disk is full); nothing was left "
        f"behind (fix: free space there (df -h {run}), or write the run elsewhere with -o/--out)"
    )


@pytest.mark.parametrize("free_pages", range(7))
def test_render_on_a_full_disk_says_so_and_leaves_nothing(small_disk, cli, free_pages):
    fill(small_disk, free_pages)
    run = small_disk / "run"
    code, err = cli("render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", str(run))
    assert (code, err) == (1, no_space("render", run))
    assert left_on(small_disk) == []


@pytest.mark.parametrize("free_pages", [0, 1, 3])
def test_submit_on_a_full_disk_leaves_no_lock_and_submits_nothing(small_disk, cli, free_pages):
    fill(small_disk, free_pages)
    run = small_disk / "run"
    code, err = cli("submit", "grpo-tiny-2n-cpu", "--cluster", "slurm-test", "-o", str(run))
    assert code == 1 and err.endswith(no_space("submit", run)), err
    assert left_on(small_disk) == []


def test_rendering_again_on_a_full_disk_keeps_the_earlier_run_folder(small_disk, cli):
    run = small_disk / "run"
    assert cli("render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", str(run))[0] == 0
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    fill_up(small_disk)
    code, err = cli("render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", str(run),
                    "grpo.max_num_steps=3")  # fmt: skip
    assert (code, err) == (1, no_space("render", run))
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
