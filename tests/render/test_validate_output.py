"""What ``hpcrl validate`` prints (issue 26 item 10): each warning once (167264e printed
every warned check in the plan table and again below it), paths never broken across lines
(the table folded mounts mid-path), and the example profile's five placeholders as one
warning (they took ~60 lines)."""

from __future__ import annotations

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles

RECIPE = "grpo-qwen2-1.5b-2n8g-megatron"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "80")


def test_validate_shows_the_plan_once_each_warning_once_and_paths_whole(tmp_path, capsys):
    assert main(["validate", RECIPE, "--cluster", "eos"]) == 0
    captured = capsys.readouterr()
    out, err = captured.out.splitlines(), captured.err.splitlines()
    text = captured.out + captured.err
    assert text.count("still hold the example profile's placeholders") == 1
    assert "placeholder" not in captured.out  # the plan's lines show passed checks only
    assert len(err) <= 9, err  # one warning, its fix, the count (rich wraps them at 80)
    # every line fits 80 columns unless it is one word too long for any line (a mount)
    for line in out:
        assert len(line) <= 80 or " " not in line.strip().split("  ")[-1].strip(), line
    run_dir = tmp_path / "runs"
    mounts = [line.split()[-1] for line in out if str(run_dir) in line and ":" in line]
    # the run folder, the code bundle and the compile cache, each whole on its line
    assert len(mounts) == 3
    assert all(mount.count(str(run_dir)) == 2 for mount in mounts)  # SOURCE:TARGET, unbroken
    (mounts_line,) = [line for line in out if line.startswith("  mounts ")]
    assert mounts_line.split() == ["mounts", "/lustre:/lustre"]
    assert out[-1] == f"OK: {RECIPE} plans on eos; nothing was written."
