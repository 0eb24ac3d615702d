"""Training checkpoints of the Megatron worker: save → load into a fresh worker (with parallel
reads) continues exactly like the run that saved, on 2 data-parallel ranks with the
distributed optimizer. The default (dp_reshardable) checkpoint saved at DP 2 resumes at DP 4,
and fails at once at another TP or PP, naming both layouts; the fully_reshardable one saved at
TP 1 x DP 2 resumes at TP 2 x PP 2 (every axis changes) and at TP 2 alone with the same
losses. The TP 2 run's own checkpoint is the one ``hpcrl export`` turns into a Hugging Face
folder with the trained policy's log-probs (was tests/megatron/test_export.py, whose own
3-step TP 2 training run cost a start-up of 2 Megatron ranks; issue 26)."""

from __future__ import annotations

import json

import pytest

from hpcrl.core.export import export_checkpoint
from hpcrl.run.checkpoints import EXPORT_RECORD
from hpcrl.run.export_progress import ExportProgress
from tests.megatron import checkpoint_ranks, harness
from tests.megatron.test_roundtrip import _hf_logprobs
from tests.recipe_builder import tiny_megatron_recipe

# Spawns gloo ranks that build real megatron-core models: minutes on the 2-core machine.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def resume_run(converted, tmp_path_factory):
    """2 DP ranks: train 2 steps, save in both formats, train 2 more; a fresh worker loads the
    default one and trains the same 2 steps. Both checkpoints stay for other layouts to load."""
    hf_path, root = converted
    base = tmp_path_factory.mktemp("megatron-resume")
    train_dir, reshardable_dir = str(base / "train"), str(base / "fully-reshardable")
    results = harness.run_ranks(
        2, checkpoint_ranks.checkpoint_resume_run, hf_path, root, train_dir, reshardable_dir
    )
    return train_dir, reshardable_dir, results


def test_resume_continues_exactly(resume_run):
    _, _, results = resume_run
    for result in results:
        continued = [s[key] for s in result["continued"] for key in ("loss", "grad_norm", "lr")]
        resumed = [s[key] for s in result["resumed"] for key in ("loss", "grad_norm", "lr")]
        assert resumed == continued  # bit for bit: same layout, same kernels, same order
        # A fresh worker (no load) starts from the converted weights, not the trained ones.
        assert result["fresh_first_loss"] > continued[0] + 1e-3
        assert result["state"]["step"] == 4
        # megatron's writer keeps a Manager process after a save; close() must stop it.
        assert result["helper_processes_left"] == []


def test_a_job_rank_resumes_at_the_saved_step(converted, tmp_path):
    """Through the real ``TrainingWorker`` (what a job's rank runs) a fresh rank loads a
    checkpoint saved after 2 steps: it counts 2 optimizer steps (manual GC's step numbers
    go on from there) and trains steps 3 and 4 as the saving rank did. The load used to
    fail: the Megatron backend's ``collect_state`` had no ``step``; and the resumed process
    used to freeze nothing, its first step not being step 1."""
    hf_path, root = converted
    (result,) = harness.run_ranks(
        1, checkpoint_ranks.training_worker_resume_run, hf_path, root,
        str(tmp_path / "checkpoint"), harness.free_port(), process_group=False,
    )  # fmt: skip
    assert result["loaded_steps"] == [2, 2]
    assert result["steps_after"] == [4, 4]
    assert result["peak_memory_gb"] == 0.0  # the contract's other key (0 on the CPU)
    # Manual GC (interval 2): the loading process's first step, 3, collects and freezes
    # what it built (it never runs step 1); step 4 is the interval's, as in the saving run.
    assert result["resumed_collections"] == [3, 4]
    for got, want in zip(result["resumed"], result["continued"], strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
        assert got["lr"] == want["lr"]


def assert_continues_like(results: list[dict], continued: list[dict]) -> None:
    """Every rank reports the global numbers of the saving run's next 2 steps. Step 2's loss
    and gradient norm depend on the loaded Adam state: with it dropped after a load at TP 2
    (weights and schedule kept) step 2 gave loss 4.3900 instead of 4.4090 and gradient norm
    1.268 instead of 1.179, far outside these tolerances."""
    for result in results:
        assert result["state"]["step"] == 4
        for got, want in zip(result["resumed"], continued, strict=True):
            assert got["lr"] == pytest.approx(want["lr"], rel=1e-12)
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)


def test_checkpoint_resumes_at_another_data_parallel_size(converted, resume_run):
    """The DP 2 run's default checkpoint, loaded by 4 DP ranks, continues like the DP 2 run."""
    hf_path, root = converted
    train_dir, _, dp2_results = resume_run
    results = harness.run_ranks(
        4, checkpoint_ranks.load_then_train_run, hf_path, root, train_dir, {}
    )
    assert [r["place"] for r in results] == [(rank, 4, True) for rank in range(4)]
    assert_continues_like(results, dp2_results[0]["continued"])


@pytest.fixture(scope="module")
def tp2_resumed(converted, resume_run, tmp_path_factory):
    """2 ranks at TP 2 x DP 1 load the fully_reshardable checkpoint, train the same 2 steps and
    save a training checkpoint of their own (the default format) in a run folder: the
    resharding test's run and the export test's tensor-parallel checkpoint (one start-up of
    2 Megatron ranks fewer in CI; issue 26)."""
    hf_path, root = converted
    _, reshardable_dir, _ = resume_run
    run_dir = tmp_path_factory.mktemp("megatron-tp2-run")
    checkpoint = run_dir / "checkpoints" / "step_000004"
    results = harness.run_ranks(
        2,
        checkpoint_ranks.load_then_train_run,
        hf_path,
        root,
        reshardable_dir,
        {"tp": 2},
        str(checkpoint),
    )
    return run_dir, checkpoint, results


def test_fully_reshardable_checkpoint_resumes_at_another_tp_and_pp(converted, resume_run):
    """Saved at TP 1 x PP 1 x DP 2, loaded at TP 2 x PP 2 x DP 1 (every axis changes): model
    weights and the distributed optimizer's state both reshard. The loading run keeps the
    default format setting: a load follows the format the checkpoint records."""
    hf_path, root = converted
    _, reshardable_dir, dp2_results = resume_run
    results = harness.run_ranks(
        4,
        checkpoint_ranks.load_then_train_run,
        hf_path,
        root,
        reshardable_dir,
        {"tp": 2, "pp": 2},
    )
    assert {r["place"][:2] for r in results} == {(0, 1)}
    assert_continues_like(results, dp2_results[0]["continued"])


def test_fully_reshardable_checkpoint_resumes_at_another_tp(resume_run, tp2_resumed):
    """The same checkpoint loaded at TP 2 x DP 1 (same world size, TP alone)."""
    _, _, dp2_results = resume_run
    _, _, results = tp2_resumed
    assert {r["place"][:2] for r in results} == {(0, 1)}
    assert_continues_like(results, dp2_results[0]["continued"])


def test_export_of_a_tensor_parallel_checkpoint_has_the_trained_policys_logprobs(
    converted,
    tp2_resumed,
    capfd,
):
    """A Megatron training checkpoint written by 2 tensor-parallel ranks (gloo) exported by
    ``hpcrl.core.export`` (what ``hpcrl export`` runs: one process, TP=1, torch_dist
    resharded, megatron-bridge's HF writer): ``from_pretrained`` on the folder gives the
    log-probs the trained policy had at the checkpoint, not the initial model's."""
    hf_path, _ = converted
    run_dir, checkpoint, results = tp2_resumed
    (trained,) = [r["saved_logprobs"] for r in results if r["place"][2]]
    initial = _hf_logprobs(hf_path, harness.fixed_batch()["input_ids"])  # converted from it

    capfd.readouterr()
    recipe = tiny_megatron_recipe(hf_path, tp=2)
    out = export_checkpoint(recipe, checkpoint, run_dir / "hf", run_dir, ExportProgress())
    said = capfd.readouterr().out  # the phases, said by the spawned export process
    phases = [line.split("] ", 1)[1] for line in said.splitlines() if "hpcrl export: [" in line]
    assert phases == [
        f"building the model of {hf_path} on one rank (TP=PP=1)",
        f"loading the checkpoint's model tensors from {checkpoint / 'megatron'}",
        f"writing the Hugging Face folder {run_dir / 'hf.partial'} (megatron-bridge)",
    ]
    exported = _hf_logprobs(str(out), harness.fixed_batch()["input_ids"])
    assert (exported - trained).abs().max().item() < 1e-5
    assert (exported - initial).abs().max().item() > 1e-2  # the trained weights, not the initial
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert (record["step"], record["backend"]) == (4, "megatron")
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "hf"]


def layout(tp: int, pp: int, dp: int) -> dict[str, int]:
    return {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
            "data_parallel_size": dp}  # fmt: skip


def test_load_at_another_tensor_parallel_size_fails_before_loading(tmp_path, monkeypatch):
    """dp_reshardable optimizer state cannot reshard across TP: megatron-core 0.16 fails deep
    in the load ("Global shape mismatch ... bucket_idx_0.param", seen with a real DP 2 → TP 2
    load). hpcrl's check reads the saved layout first and names both; nothing of the worker is
    touched before it."""
    import torch

    from hpcrl.core.backends.megatron import checkpoint

    (tmp_path / "megatron").mkdir()
    torch.save({"layout": layout(1, 1, 2)}, tmp_path / "megatron" / "scheduler.pt")
    monkeypatch.setattr(checkpoint, "model_parallel_layout", lambda: layout(2, 1, 1))
    with pytest.raises(checkpoint.CheckpointLayoutMismatch) as failed:
        checkpoint.load_training_state(object(), str(tmp_path))
    message = str(failed.value)
    assert "saved with policy.megatron_cfg.tensor_model_parallel_size=1" in message
    assert "this run has tensor_model_parallel_size=2" in message
    assert "policy.megatron_cfg.checkpoint.optimizer_format=fully_reshardable" in message


def test_layout_check_allows_other_dp_other_formats_and_old_checkpoints():
    from hpcrl.core.backends.megatron.checkpoint import (
        CheckpointLayoutMismatch,
        check_layout,
        check_optimizer_kind,
    )

    check_layout(layout(2, 1, 2), layout(2, 1, 8), "/ckpt")  # DP reshards
    check_layout(None, layout(4, 2, 1), "/ckpt")  # saved before layouts were recorded
    for reshardable in ("fully_reshardable", "per_parameter"):
        check_layout(layout(1, 1, 2), layout(2, 2, 1), "/ckpt", reshardable)
    with pytest.raises(CheckpointLayoutMismatch, match="pipeline_model_parallel_size=2"):
        check_layout(layout(2, 2, 1), layout(2, 1, 2), "/ckpt", "dp_reshardable")
    check_optimizer_kind("fully_reshardable", "dp_reshardable", "/ckpt")
    with pytest.raises(CheckpointLayoutMismatch, match="saved without the distributed optimizer"):
        check_optimizer_kind("per_parameter", "dp_reshardable", "/ckpt")
