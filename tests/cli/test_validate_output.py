"""What ``hpcrl validate`` prints (issue 26 item 10): each warning once (167264e printed
every warned check in the plan table and again below it), paths never broken across lines
(the table folded mounts mid-path), and the example profile's five placeholders as one
warning (they took ~60 lines)."""

from __future__ import annotations

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles

RECIPE = "grpo-qwen2-1.5b-2n8g-megatron"
#: eos mounts /lustre; the shipped data lies in the checkout, which the job would not see
#: (an error): a path only an image could hold instead (a warning).
IMAGE_DATA = "data.train_path=/opt/image-data/math_tiny.jsonl"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "80")


def test_validate_shows_the_plan_once_each_warning_once_and_paths_whole(tmp_path, capsys):
    assert main(["validate", RECIPE, "--cluster", "eos", IMAGE_DATA]) == 0
    captured = capsys.readouterr()
    out, err = captured.out.splitlines(), captured.err.splitlines()
    text = captured.out + captured.err
    assert text.count("still hold the example profile's placeholders") == 1
    assert " ".join(text.split()).count("only the image could hold it") == 1
    assert "placeholder" not in captured.out  # the plan's lines show passed checks only
    # three warnings (placeholders, data only an image could hold, a run folder under pytest's
    # /tmp), their fixes, the count (rich wraps them at 80)
    assert len(err) <= 22, err
    assert err[-1] == "0 errors, 3 warnings"
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


def test_validate_asks_git_nothing_and_plans_what_render_plans(monkeypatch, capsys):
    """The checkout's commit is named in the written script and job spec only: validate does
    not ask git for it (a ``git status`` per validate, slow on a large checkout of a shared
    file system: docs/performance.md, item 6); its plan lines are the render's."""
    from hpcrl.cli.prepare import plan_lines, prepare
    from hpcrl.plan import bundle

    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(bundle, "_git", lambda directory, *args: asked.append(args) or None)
    bundle.hpcrl_git_sha.cache_clear()
    try:
        assert main(["validate", "grpo-tiny-1n-cpu", "--cluster", "local"]) == 0
        assert asked == []
        validated = prepare("grpo-tiny-1n-cpu", "local", [], writes=False).spec
        rendered = prepare("grpo-tiny-1n-cpu", "local", []).spec
    finally:
        bundle.hpcrl_git_sha.cache_clear()
    assert plan_lines(validated, 100) == plan_lines(rendered, 100)
    assert validated.code.git_sha is None
    assert capsys.readouterr().out.splitlines()[-1].startswith("OK: grpo-tiny-1n-cpu plans")
