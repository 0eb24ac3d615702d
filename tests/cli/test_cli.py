"""``hpcrl validate / render / show`` on the shipped recipes and profiles, in-process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")


def run_folders(runs: Path) -> list[Path]:
    """The run folders in ``runs`` (not the caches hpcrl keeps beside them)."""
    return [path for path in runs.iterdir() if not path.name.startswith(".")]


def test_render_writes_the_run_folder_and_says_how_to_submit(tmp_path, capsys):
    code = main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "grpo.max_num_steps=2"])
    out = capsys.readouterr().out
    assert code == 0
    (run_dir,) = run_folders(tmp_path / "runs")
    assert run_dir.name.startswith("grpo-tiny-1n-cpu-local-")
    # beside it, shared by the runs there: torch.compile's caches (hpcrl.plan.compile_cache)
    assert (tmp_path / "runs" / ".hpcrl-cache" / "torch-compile").is_dir()
    assert sorted(path.name for path in run_dir.iterdir()) == [
        ".hpcrl.lock",  # the run folder's lock (hpcrl.run.folder_lock.run_folder_lock)
        "auth",  # the job's Ray token (tests/render/test_ray_auth_render.py)
        "job.sbatch",
        "jobspec.json",
        "manifest.json",
        "recipe.resolved.yaml",
    ]
    assert f"Wrote {run_dir}/" in out
    assert "Submit with: hpcrl submit grpo-tiny-1n-cpu --cluster local grpo.max_num_steps=2" in out
    assert "max_num_steps: 2" in (run_dir / "recipe.resolved.yaml").read_text()
    # Same inputs, same folder; another override, another folder.
    assert main(["render", "grpo-tiny-1n-cpu", "grpo.max_num_steps=2", "--cluster", "local"]) == 0
    assert main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "grpo.max_num_steps=3"]) == 0
    assert len(run_folders(tmp_path / "runs")) == 2


def test_show_prints_exactly_what_render_writes(tmp_path, capsys):
    assert main(["render", "grpo-tiny-2n-cpu", "-c", "slurm-test", "-o", "out"]) == 0
    written = (tmp_path / "out" / "job.sbatch").read_text()
    capsys.readouterr()
    # show plans with the default run folder; render it there too and compare.
    assert main(["show", "grpo-tiny-2n-cpu", "-c", "slurm-test"]) == 0
    shown = capsys.readouterr().out
    assert main(["render", "grpo-tiny-2n-cpu", "-c", "slurm-test"]) == 0
    (default_dir,) = run_folders(tmp_path / "runs")
    assert shown == (default_dir / "job.sbatch").read_text()
    # The other differences: the -o folder is part of the command that wrote it, and the
    # compile cache is beside each run folder (tmp_path/.hpcrl-cache, runs/.hpcrl-cache).
    shown = shown.replace(str(tmp_path / "runs" / ".hpcrl-cache"), str(tmp_path / ".hpcrl-cache"))
    written_by = "# Written by: hpcrl render grpo-tiny-2n-cpu --cluster slurm-test"
    assert f"{written_by}\n" in shown
    assert f"{written_by} -o {tmp_path / 'out'}\n" in written
    assert shown.replace(str(default_dir), "X") == written.replace(str(tmp_path / "out"), "X")\
        .replace(f"{written_by} -o X\n", f"{written_by}\n")  # fmt: skip
    assert "\x1b[" not in shown  # not a TTY: no colour codes


#: eos mounts /lustre; the shipped data lies in the checkout, which the job would not see
#: (hpcrl.plan.environment refuses it): a path only an image could hold (a warning).
EOS_DATA = "data.train_path=/opt/image-data/math_tiny.jsonl"


def test_validate_prints_the_plan(capsys):
    assert main(["validate", "grpo-qwen2-1.5b-2n8g-megatron", "--cluster", "eos", EOS_DATA]) == 0
    out = capsys.readouterr().out
    assert "2 × 8 GPUs = 16 ranks" in out
    assert "megatron: tp=2 × pp=1 × cp=1 × dp=8" in out
    assert "/lustre/fsw/your_project/megatron_checkpoints (from NRL_MEGATRON_CHECKPOINT_DIR)" in out
    assert "OK" in out


def test_problems_are_printed_together_with_exit_code_2(capsys):
    code = main(["validate", "grpo-llama3.1-8b-2n8g-automodel", "--cluster", "local"])
    captured = capsys.readouterr()
    assert code == 2
    assert "cluster.num_nodes" in captured.err and "cluster.gpus_per_node" in captured.err
    assert "fix:" in captured.err and "2 errors" in captured.err
    assert "Traceback" not in captured.err


def test_recipe_and_profile_problems_come_together(capsys):
    code = main(
        ["validate", "grpo-tiny-1n-cpu", "--cluster", "no-such-site", "policy.no_such_key=1"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "no-such-site" in err and "no_such_key" in err


def test_stray_options_are_still_rejected(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "--bogus"])
    assert caught.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_help_imports_no_stage(tmp_path):
    """`hpcrl --help` loads argparse and the command modules, not config, Jinja or rich."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hpcrl.cli.main", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    heavy = {"hpcrl.config", "jinja2", "rich", "omegaconf", "cattrs", "attrs", "yaml", "submitit"}
    assert not heavy & imported, sorted(heavy & imported)
    assert "validate" in result.stdout and "render" in result.stdout


def test_console_script_is_installed():
    hpcrl = Path(sys.executable).parent / "hpcrl"
    result = subprocess.run([str(hpcrl), "--version"], capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("hpcrl ")


def test_render_into_a_folder_writes_the_command_with_its_folder(tmp_path, capsys):
    assert main(["render", "grpo-tiny-1n-cpu", "-c", "local", "-o", "mine", "grpo.seed=3"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "mine"
    command = f"grpo-tiny-1n-cpu --cluster local grpo.seed=3 -o {folder}"
    assert f"# Written by: hpcrl render {command}\n" in (folder / "job.sbatch").read_text()
    assert f"Submit with: hpcrl submit {command}\n" in out


def test_a_profile_given_by_path_plans_on_its_file_name(tmp_path, capsys):
    profile = tmp_path / "site" / "mybox.yaml"
    profile.parent.mkdir()
    profile.write_text("defaults: local.yaml\n")  # the shipped local, found by name
    assert main(["validate", "grpo-tiny-1n-cpu", "--cluster", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "grpo-tiny-1n-cpu on mybox" in out
    assert "OK: grpo-tiny-1n-cpu plans on mybox; nothing was written." in out


def test_the_shipped_eos_placeholders_refuse_submit_and_warn_validate_and_render(
    tmp_path, monkeypatch, capsys
):
    """No user profile dirs (HPCRL_CLUSTER_PROFILES and the XDG config folder empty): ``eos`` is
    the shipped example, whose ``account: your_account`` would land in ``#SBATCH --account``."""
    empty = tmp_path / "no-profiles"
    empty.mkdir()
    monkeypatch.setenv("HPCRL_CLUSTER_PROFILES", str(empty))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(empty))
    bin_dir = tmp_path / "bin"  # a stand-in sbatch that records any call
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/sbatch.calls\nexit 1\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    before = sorted(tmp_path.iterdir())
    recipe = "recipes/grpo-qwen2-1.5b-2n8g-megatron.yaml"
    source = Path(__file__).resolve().parents[2] / recipe
    held = (
        "5 values still hold the example profile's placeholders: slurm.account "
        "('your_account'); container.mounts[1], container.workdir, env.HF_HOME, "
        "env.NRL_MEGATRON_CHECKPOINT_DIR ('your_project')"
    )
    fix = (
        "fix: copy the profile to ~/.config/hpcrl/cluster_profiles/eos.yaml (or a folder on "
        "$HPCRL_CLUSTER_PROFILES) and set them there; the copy wins over the shipped one"
    )

    assert main(["submit", str(source), "--cluster", "eos"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich folds long lines
    assert f"error profile[eos] {held} {fix} 1 error, 0 warnings" == err, err
    assert "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before  # no run folder, no bundle
    assert not (tmp_path / "sbatch.calls").exists()  # nothing submitted

    for command in ("validate", "render"):
        assert main([command, str(source), "--cluster", "eos", EOS_DATA]) == 0, command
        captured = capsys.readouterr()
        said = " ".join((captured.out + captured.err).split())
        warning = f"warning profile[eos] {held}; the job would run with them {fix}"
        assert said.count(warning) == 1, said  # once: not also in the plan's lines
    assert "--account=your_account" in next((tmp_path / "runs").glob("*/job.sbatch")).read_text()
