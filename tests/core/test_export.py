"""Automodel weights out as Hugging Face folders that ``from_pretrained`` loads with the trained
policy's log-probs:

- ``hpcrl.core.export`` (what ``hpcrl export`` runs) on a checkpoint written by 2 FSDP ranks
  (gloo): the folder's log-probs equal the live policy's at the checkpoint, and differ from
  the initial model's;
- the shipped SFT recipe through the driver with ``checkpointing.save_consolidated: true``:
  the job writes ``<checkpoint>/hf``; ``hpcrl export RUN -o DIR`` (the run's Python in a
  subprocess) writes the same tensors bit for bit; ``hpcrl status RUN`` lists both
  (``assert_consolidated_checkpoint_exports``, on the 20-step run of
  tests/core/test_sft_learns.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import load_file

from tests.require import require_module

require_module("ray")

from hpcrl.cli.main import main as hpcrl_main  # noqa: E402
from hpcrl.core.export import export_checkpoint  # noqa: E402
from hpcrl.run.checkpoints import CONSOLIDATED_SUBDIR, EXPORT_RECORD  # noqa: E402
from hpcrl.run.export_progress import ExportProgress  # noqa: E402
from tests.core.parallel_harness import (  # noqa: E402
    make_batch,
    masked_nll_loss,
    reference_logprobs,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe  # noqa: E402

pytestmark = pytest.mark.slow  # Ray workers on the 2-core machine


def hf_logprobs(folder: str | Path, batch: dict) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return reference_logprobs(model, batch)


def safetensors_of(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_export_of_an_fsdp_checkpoint_has_the_trained_policys_logprobs(
    ray_cluster,
    tiny_model_path,
    tmp_path,
    capsys,
):
    recipe = tiny_automodel_recipe(lr=5e-3)
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, model_name=tiny_model_path))
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    batch = make_batch(seed=11)
    policy = start_policy(recipe, tiny_model_path, world_size=2)  # FSDP2 over 2 gloo ranks
    try:
        for seed in range(2):
            policy.train(make_batch(seed), masked_nll_loss)
        policy.save_checkpoint(str(checkpoint), {"step": 2})
        live = policy.get_logprobs(batch)
    finally:
        policy.shutdown()

    capsys.readouterr()
    out = export_checkpoint(recipe, checkpoint, tmp_path / "hf", tmp_path, ExportProgress())
    phases = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert phases == [  # each phase said as it starts (hpcrl export --wait shows them)
        # tiny qwen2: 2 layers of 12 tensors, the embedding, the final norm, the lm head
        f"reading 27 model tensors (0.00 GiB) from {checkpoint / 'dcp'}",
        f"writing the Hugging Face folder {tmp_path / 'hf.partial'} (safetensors, config, "
        "tokenizer)",
    ]
    mask = batch["attention_mask"].bool()
    exported = hf_logprobs(out, batch)
    torch.testing.assert_close(exported[mask], live[mask], atol=1e-5, rtol=0)
    untrained = hf_logprobs(tiny_model_path, batch)
    assert (exported[mask] - untrained[mask]).abs().max() > 1e-2  # the trained weights
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert (record["step"], record["backend"], record["written_by"]) == (
        2, "automodel", "hpcrl export"
    )  # fmt: skip
    assert record["checkpoint"] == str(checkpoint)
    assert not (tmp_path / "hf.partial").exists()
    from hpcrl.core.models.tokenizer import load_tokenizer

    assert load_tokenizer(str(out)).decode(load_tokenizer(str(out))("a+b=3").input_ids) == "a+b=3"


#: The shipped SFT recipe's run in tests/core/test_sft_learns.py saves its last step so (it
#: was a 2-step run of the same recipe here, one more start-up of its Ray group; issue 26).
SAVE_CONSOLIDATED_AT_STEP_20 = (
    "checkpointing.enabled=true", "checkpointing.save_period=20",
    "checkpointing.save_consolidated=true",
)  # fmt: skip


def assert_consolidated_checkpoint_exports(run: Path, step: int, tmp_path: Path, capsys) -> None:
    """The job wrote ``<checkpoint>/hf`` of its last step; ``hpcrl export RUN -o DIR`` (the
    run's Python in a subprocess) writes the same tensors bit for bit, trained ones; a second
    export does nothing; ``hpcrl status RUN`` lists both. ``tmp_path``: the current folder
    (the default export folder is relative to it)."""
    checkpoint = run / "checkpoints" / f"step_{step:06d}"
    by_job = checkpoint / CONSOLIDATED_SUBDIR
    assert json.loads((by_job / EXPORT_RECORD).read_text())["written_by"] == (
        "checkpointing.save_consolidated"
    )
    capsys.readouterr()

    assert hpcrl_main(["export", str(run)]) == 0  # the job wrote it: said, nothing converted
    assert f"The job already wrote step {step}'s weights" in capsys.readouterr().out
    out = tmp_path / "exported" / "sft-hf"
    assert hpcrl_main(["export", str(run), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"Wrote {out.relative_to(tmp_path)}: transformers.AutoModelForCausalLM" in said

    configs = [json.loads((folder / "config.json").read_text()) for folder in (out, by_job)]
    assert configs[0] == configs[1] and configs[0]["use_cache"] is True
    by_export, by_job_tensors = safetensors_of(out), safetensors_of(by_job)
    assert sorted(by_export) == sorted(by_job_tensors)
    for name, tensor in by_job_tensors.items():
        assert torch.equal(by_export[name], tensor), name
    batch = make_batch(seed=3)
    mask = batch["attention_mask"].bool()
    from hpcrl.core.models.tiny import resolve_model_path

    untrained = hf_logprobs(resolve_model_path("tiny:qwen2"), batch)
    assert (hf_logprobs(out, batch)[mask] - untrained[mask]).abs().max() > 1e-2

    assert hpcrl_main(["export", str(run), "-o", str(out)]) == 0  # again: nothing to do
    assert f"Step {step} is already exported" in capsys.readouterr().out
    assert hpcrl_main(["export", str(run), "--step", "7"]) == 2
    assert "no complete checkpoint of step 7" in capsys.readouterr().err
    hpcrl_main(["status", str(run), "--wide"])
    shown = capsys.readouterr().out
    assert f"exports    step {step}: {by_job} (checkpointing.save_consolidated)" in shown
    assert f"           step {step}: {out} (hpcrl export)" in shown
