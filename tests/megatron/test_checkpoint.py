"""Training checkpoints of the Megatron worker: save → load into a fresh worker (with parallel
reads) continues exactly like the run that saved, on 2 data-parallel ranks with the
distributed optimizer. The default (dp_reshardable) checkpoint saved at DP 2 resumes at DP 4,
and fails at once at another TP or PP, naming both layouts; the fully_reshardable one saved at
TP 1 x DP 2 resumes at TP 2 x PP 2 (every axis changes) and at TP 2 alone with the same
losses."""

from __future__ import annotations

import pytest

from tests.megatron import checkpoint_ranks, harness

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
        assert result["state"]["steps_done"] == 4
        # megatron's writer keeps a Manager process after a save; close() must stop it.
        assert result["helper_processes_left"] == []


def assert_continues_like(results: list[dict], continued: list[dict]) -> None:
    """Every rank reports the global numbers of the saving run's next 2 steps. Step 2's loss
    and gradient norm depend on the loaded Adam state: with it dropped after a load at TP 2
    (weights and schedule kept) step 2 gave loss 4.3900 instead of 4.4090 and gradient norm
    1.268 instead of 1.179, far outside these tolerances."""
    for result in results:
        assert result["state"]["steps_done"] == 4
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


@pytest.mark.parametrize(
    ("world_size", "loading_layout"),
    [(4, {"tp": 2, "pp": 2}), (2, {"tp": 2})],
    ids=["tp2-pp2-dp1", "tp2-dp1"],
)
def test_fully_reshardable_checkpoint_resumes_at_another_tp_or_pp(
    converted,
    resume_run,
    world_size,
    loading_layout,
):
    """Saved at TP 1 x PP 1 x DP 2, loaded at TP 2 x PP 2 x DP 1 (every axis changes) and at
    TP 2 x DP 1 (same world size, TP alone): model weights and the distributed optimizer's
    state both reshard. The loading run keeps the default format setting: a load follows the
    format the checkpoint records."""
    hf_path, root = converted
    _, reshardable_dir, dp2_results = resume_run
    results = harness.run_ranks(
        world_size,
        checkpoint_ranks.load_then_train_run,
        hf_path,
        root,
        reshardable_dir,
        loading_layout,
    )
    assert {r["place"][:2] for r in results} == {(0, 1)}
    assert_continues_like(results, dp2_results[0]["continued"])


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
