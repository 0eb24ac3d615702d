"""``hpcrl export RUN --wait`` on a Slurm run whose job ran in a container: the export job goes
through the real test cluster, in the pyxis stand-in's image (tests/standin_image.py: torch and
transformers, no hpcrl, no submitit) with the run's code bundle, and writes the checkpoint's
trained weights, bit for bit, as a Hugging Face folder that ``hpcrl status`` lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.core.checkpoint_rank import train_and_save_run
from tests.megatron.harness import run_ranks
from tests.slurm.harness import wait_sacct_states
from tests.slurm.test_container_jobs import pyxis_profile_text, task_python, user_shell
from tests.standin_image import build_image
from tests.submit.jobs_harness import REPO, output_of

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

HPCRL = Path(sys.executable).parent / "hpcrl"
RECIPE = str(REPO / "recipes" / "sft-tiny-1n-cpu.yaml")


def hpcrl(args: list[str], cwd: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(HPCRL), *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=500)  # fmt: skip


def test_export_job_writes_the_trained_weights_with_the_runs_image_and_bundle(tmp_path):
    from hpcrl.core.models.tiny import ensure_tiny_model

    image = build_image(tmp_path / "image")
    if not task_python(image).startswith(str(image)):
        pytest.fail(
            "the running pyxis stand-in predates image folders (tests/slurm/cluster.sh start)"
        )
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "pyxis-image.yaml").write_text(pyxis_profile_text("pyxis-image", image))
    shell = user_shell(profiles, HPCRL_CACHE=str(tmp_path / "cache"))
    run = tmp_path / "runs" / "sft"
    rendered = hpcrl(["render", RECIPE, "--cluster", "pyxis-image", "-o", str(run),
                      "cluster.gpus_per_node=1"], tmp_path, shell)  # fmt: skip
    assert rendered.returncode == 0, output_of(rendered)
    # The run's checkpoint, as its job would have left it (trained here: the point is the export)
    model = ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path / "cache" / "models"))
    checkpoint = run / "checkpoints" / "step_000001"
    (trained,) = run_ranks(1, train_and_save_run, model, str(checkpoint), megatron=False)

    result = hpcrl(["export", str(run), "--wait"], tmp_path, shell)
    assert result.returncode == 0, output_of(result)
    out = run / "exports" / "step_000001"
    said = " ".join(result.stdout.split())
    shown = out.relative_to(tmp_path)  # paths are shown relative to the working directory
    assert f"step 1 of runs/sft → {shown} Its log: " in said, said
    assert f"Wrote {shown}: transformers.AutoModelForCausalLM.from_pretrained" in said
    (script,) = (run / "exports").glob("export-step_000001.sbatch")
    assert "--container-image=" + str(image) in script.read_text()
    job_id = said.split("Submitted export job ")[1].split()[0]
    wait_sacct_states(job_id, ["COMPLETED"])
    log = (run / "exports" / "submitit" / f"{job_id}_0_log.out").read_text()
    assert f"wrote {out}" in log  # hpcrl.core.export, run by the image's python from the bundle

    exported: dict[str, torch.Tensor] = {}
    for file in out.glob("*.safetensors"):
        exported.update(load_file(file))
    assert sorted(exported) == sorted(trained)
    for name, tensor in trained.items():
        assert torch.equal(exported[name], tensor), name
    status = hpcrl(["status", str(run), "--wide"], tmp_path, shell)
    assert f"exports    step 1: {out} (hpcrl export)" in status.stdout, output_of(status)
