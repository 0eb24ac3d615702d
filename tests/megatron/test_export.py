"""A Megatron training checkpoint written by 2 tensor-parallel ranks (gloo) exported by
``hpcrl.core.export`` (what ``hpcrl export`` runs: one process, TP=1, torch_dist resharded,
megatron-bridge's HF writer): ``from_pretrained`` on the folder gives the log-probs the
trained policy had at the checkpoint, not the initial model's."""

from __future__ import annotations

import json

import pytest

from hpcrl.core.export import export_checkpoint
from hpcrl.run.checkpoints import EXPORT_RECORD
from hpcrl.run.export_progress import ExportProgress
from tests.megatron import export_ranks, harness
from tests.megatron.test_roundtrip import _hf_logprobs
from tests.recipe_builder import tiny_megatron_recipe

# Spawns gloo ranks that build real megatron-core models: minutes on the 2-core machine.
pytestmark = pytest.mark.slow


def test_export_of_a_tensor_parallel_checkpoint_has_the_trained_policys_logprobs(
    converted,
    tmp_path,
    capfd,
):
    hf_path, root = converted
    checkpoint = tmp_path / "checkpoints" / "step_000003"
    results = harness.run_ranks(
        2, export_ranks.train_and_save_run, hf_path, root, 2, str(checkpoint)
    )
    ((initial, trained),) = [r for r in results if r is not None]

    capfd.readouterr()
    recipe = tiny_megatron_recipe(hf_path, tp=2)
    out = export_checkpoint(recipe, checkpoint, tmp_path / "hf", tmp_path, ExportProgress())
    said = capfd.readouterr().out  # the phases, said by the spawned export process
    phases = [line.split("] ", 1)[1] for line in said.splitlines() if "hpcrl export: [" in line]
    assert phases == [
        f"building the model of {hf_path} on one rank (TP=PP=1)",
        f"loading the checkpoint's model tensors from {checkpoint / 'megatron'}",
        f"writing the Hugging Face folder {tmp_path / 'hf.partial'} (megatron-bridge)",
    ]
    exported = _hf_logprobs(str(out), harness.fixed_batch()["input_ids"])
    assert (exported - trained).abs().max().item() < 1e-5
    assert (exported - initial).abs().max().item() > 1e-2  # the trained weights, not the initial
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert (record["step"], record["backend"]) == (3, "megatron")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "hf"]
