"""Rendering: the submitit contract, determinism, and the run folder."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from hpcrl.config.errors import ConfigError
from hpcrl.plan.planner import plan
from hpcrl.render.run_dir_name import default_run_dir
from hpcrl.render.run_folder import git_sha, write_run_folder
from hpcrl.render.script import render_sbatch
from tests.plan.planning_inputs import (
    GOLDEN_HOST,
    GOLDEN_PYTHON,
    GOLDEN_RUN_DIR,
    local_profile,
    plain_slurm_profile,
    pyxis_profile,
)
from tests.recipe_builder import automodel_recipe, megatron_recipe
from tests.render.shell import assert_bash_parses, assert_shellcheck_clean


def make_plan(recipe, profile, **kwargs):
    kwargs.setdefault("run_dir", GOLDEN_RUN_DIR)
    kwargs.setdefault("host", GOLDEN_HOST)
    kwargs.setdefault("recipe_source", "recipes/grpo-test.yaml")
    return plan(recipe, profile, **kwargs)


def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("array_size", [None, 3])
def test_script_keeps_what_submitit_needs(array_size):
    """Output paths, signal, open mode, SUBMITIT_EXECUTOR and the command match submitit's own."""
    spec = make_plan(
        automodel_recipe(num_nodes=2, gpus_per_node=2), plain_slurm_profile(), array_size=array_size
    )
    text = render_sbatch(spec)
    theirs = _make_sbatch_string(
        command=spec.task_command,
        folder=spec.submitit_folder,
        nodes=2,
        signal_delay_s=spec.signal_delay_s,
        map_count=array_size,
        array_parallelism=spec.array_parallelism or 256,
    )
    for key in ("output", "error", "signal", "open-mode") + (("array",) if array_size else ()):
        their_line = next(
            line for line in sbatch_lines(theirs) if line.startswith(f"#SBATCH --{key}=")
        )
        assert their_line in sbatch_lines(text)
    assert "\nexport SUBMITIT_EXECUTOR=slurm\n" in text
    their_srun = next(line for line in theirs.splitlines() if line.startswith("srun "))
    their_argv = shlex.split(their_srun)
    ours = shlex.split(text[text.index("\nsrun \\") :].replace("\\\n", " "))
    # submitit passes --output X --error Y; hpcrl writes --output=X --error=Y.
    assert f"--output={their_argv[their_argv.index('--output') + 1]}" in ours
    assert f"--error={their_argv[their_argv.index('--error') + 1]}" in ours
    assert ours[-len(spec.task_argv) :] == shlex.split(spec.task_command)
    assert their_srun.endswith(spec.task_command)


def test_rendering_is_deterministic_and_has_no_clock():
    spec = make_plan(
        megatron_recipe(), pyxis_profile(), overrides=["policy.train_global_batch_size=64"]
    )
    first, second = render_sbatch(spec), render_sbatch(spec)
    assert first == second
    assert "2026" not in first and "date" not in first


def test_pyxis_script_shape():
    text = render_sbatch(make_plan(megatron_recipe(), pyxis_profile()))
    srun_block = text[text.index("\nsrun \\") :]
    assert srun_block.count("srun") == 1
    assert "  '--container-image=nvcr.io#nvidia/nemo-rl:v0.7.0' \\\n" in srun_block
    bundle = "/runs/.hpcrl-bundles/hpcrl-0.1.0-0123456789abcdef"
    cache = "/runs/.hpcrl-cache/torch-compile"
    mounts = f"/lustre:/lustre,/runs/golden:/runs/golden,{bundle}:{bundle}:ro,{cache}:{cache}"
    assert f"  --container-mounts={mounts} \\\n" in srun_block
    assert f"  /usr/bin/env /opt/venv/bin/python {bundle}/hpcrl_entry.py -u -m " in srun_block
    assert "  --container-workdir=/lustre/hpcrl \\\n" in srun_block
    assert "  --no-container-mount-home \\\n" in srun_block
    assert "# Megatron checkpoint dir: /lustre/cache/hf/nemo_rl (from HF_HOME)." in text
    assert "# Written by: hpcrl render recipes/grpo-test.yaml --cluster site\n" in text
    assert text.index("#SBATCH") < text.index("set -euo pipefail")
    assert "HF_TOKEN" in text and "export HF_TOKEN" not in text
    assert_bash_parses(text)
    assert_shellcheck_clean(text)


def test_plain_srun_without_container():
    text = render_sbatch(
        make_plan(automodel_recipe(num_nodes=2, gpus_per_node=2), plain_slurm_profile())
    )
    assert "--container" not in text
    assert "#SBATCH --gres" not in text
    # No container: the interpreter that ran hpcrl, by its absolute path.
    assert text.rstrip().endswith(
        f"\n  {GOLDEN_PYTHON} -u -m submitit.core._submit /runs/golden/submitit"
    )


def test_local_script_runs_the_task_command_directly(tmp_path):
    # A profile that names its python gets exactly that (here: the fake below).
    profile = local_profile(pass_env=("HF_TOKEN", "WANDB_API_KEY"), python="python3")
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=2), profile, run_dir=str(tmp_path))
    text = render_sbatch(spec)
    assert "#SBATCH" not in text and "srun" not in text
    assert text.endswith(f"\nexec python3 -u -m submitit.core._submit {tmp_path}/submitit\n")
    assert_shellcheck_clean(text)
    # Run it with a fake python3 that prints what it received.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "python3"
    fake.write_text(
        '#!/bin/bash\necho "$SUBMITIT_EXECUTOR $SUBMITIT_LOCAL_NTASKS $HPCRL_RUN_DIR $*"\n'
    )
    fake.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(text)
    result = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{fake_bin}:/usr/bin:/bin", "HF_TOKEN": "x"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"local 1 {tmp_path} -u -m submitit.core._submit {tmp_path}/submitit\n"
    assert (
        result.stderr
        == "hpcrl: WANDB_API_KEY is not set in the submitting shell; the job runs without it\n"
    )


def test_setup_lines_run_with_nounset_relaxed(tmp_path):
    spec = make_plan(
        automodel_recipe(num_nodes=1, gpus_per_node=2),
        local_profile(
            setup_lines=('echo "site ${UNSET_BY_SITE_SCRIPT}done"',), pass_env=(), python="python3"
        ),
        run_dir=str(tmp_path),
    )
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(spec).replace("exec python3", "echo python3"))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "site done"


def test_write_run_folder(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    recipe_path = repo / "grpo-test.yaml"
    recipe_path.write_text("policy: {}\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()

    run_dir = tmp_path / "runs" / "a"
    spec = make_plan(  # host=None: this environment, whose code bundle render writes
        megatron_recipe(), pyxis_profile(), run_dir=str(run_dir), overrides=["grpo.seed=3"],
        host=None,
    )  # fmt: skip
    run = write_run_folder(
        spec, {"policy": {"model_name": "m"}, "grpo": {"seed": 3}}, recipe_path=recipe_path
    )
    assert run.script.read_text() == render_sbatch(spec)
    bundle = spec.code.bundle
    assert bundle.path.startswith(f"{tmp_path}/runs/.hpcrl-bundles/hpcrl-")
    assert f"{bundle.path}/hpcrl_entry.py" in run.script.read_text()
    assert (Path(bundle.path) / "hpcrl" / "job" / "node.py").is_file()
    assert (run_dir / "code").resolve() == Path(bundle.path)  # the run folder points at it
    assert os.readlink(run_dir / "code") == f"../.hpcrl-bundles/{Path(bundle.path).name}"
    assert stat.S_IMODE(run.script.stat().st_mode) == 0o755
    assert run.resolved_recipe.read_text() == "policy:\n  model_name: m\ngrpo:\n  seed: 3\n"
    manifest = json.loads(run.manifest.read_text())
    assert manifest["recipe_git_sha"] == head
    assert manifest["profile"] == "site"
    assert manifest["overrides"] == ["grpo.seed=3"]
    assert any(
        "layout" not in m and "/lustre/cache/hf/nemo_rl" in m for m in manifest["checks"]["passed"]
    )
    assert manifest["checks"]["warned"] == []
    assert manifest["plan"]["layout"]["dp"] == 16

    (run_dir / "submitit").mkdir()
    (run_dir / "submitit" / "123_submitted.pkl").write_text("x")
    with pytest.raises(ConfigError) as caught:
        write_run_folder(spec, {}, recipe_path=recipe_path)
    assert caught.value.problems[0].path == "run_dir"


def test_git_sha_is_none_outside_a_repository(tmp_path):
    assert git_sha(tmp_path) is None
    assert git_sha(None) is None


def test_default_run_dir_changes_with_inputs(tmp_path):
    profile = pyxis_profile()
    first = default_run_dir("recipes/grpo-x.yaml", {"a": 1}, profile, tmp_path)
    assert first == default_run_dir("grpo-x", {"a": 1}, profile, tmp_path)
    assert first.name.startswith("grpo-x-site-") and len(first.name) == len("grpo-x-site-") + 8
    assert first != default_run_dir("grpo-x", {"a": 2}, profile, tmp_path)
    assert first != default_run_dir("grpo-x", {"a": 1}, pyxis_profile(gpus_per_node=4), tmp_path)
