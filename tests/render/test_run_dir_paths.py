"""Run folders Linux cannot hold (issue 26): a 2000-level ``-o`` ended in a RecursionError
(exit 70) from ``Path.mkdir(parents=True)``; now a path too long for the job's files is
refused at plan time (exit 2), and folders are created without recursion."""

from __future__ import annotations

from hpcrl.cli.main import main
from hpcrl.run.atomic_files import make_folders
from tests.plan.planning_inputs import isolate_from_user_profiles


def test_a_2000_level_run_folder_is_a_plan_error(tmp_path, monkeypatch, capsys):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    deep = str(tmp_path / "deep") + "/a" * 2000
    assert main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", deep]) == 2
    err = " ".join(capsys.readouterr().err.split())
    size = len(deep.encode())
    assert (
        f"error run_dir = {repr(deep)[:117]}... {size:,} bytes long (at most 3,583): Linux refuses "
        "paths over 4,096 bytes and names over 255, and the job writes files a few hundred "
        "characters deep below its run folder fix: choose a shorter folder with -o/--out"
    ) in err, err
    assert not (tmp_path / "deep").exists()


def test_a_folder_name_over_255_bytes_is_a_plan_error(tmp_path, monkeypatch, capsys):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    assert main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o",
                 str(tmp_path / ("x" * 300))]) == 2  # fmt: skip
    assert "a folder name of 300 bytes (at most 255)" in " ".join(capsys.readouterr().err.split())


def test_folders_1500_deep_are_made_without_recursion(tmp_path):
    deep = tmp_path.joinpath(*["d"] * 1500)
    try:
        created = make_folders(deep)
        assert deep.is_dir() and len(created) == 1500 and created[0] == tmp_path / "d"
        assert make_folders(deep) == []
    finally:  # removed here, innermost first: shutil.rmtree (pytest's cleanup) recurses
        for folder in reversed([tmp_path.joinpath(*["d"] * n) for n in range(1, 1501)]):
            if folder.is_dir():
                folder.rmdir()
