"""DCP checkpoints: resume continues the run exactly; the HF export reloads with equal log-probs."""

from __future__ import annotations

import functools
import json
import os

import attrs
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hpcrl.config.recipe import LrSchedulerCfg
from tests.core.parallel_harness import (
    full_weights,
    make_batch,
    masked_nll_loss,
    reference_logprobs,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe

pytestmark = pytest.mark.slow


def dropout_nll_loss(
    logprobs: torch.Tensor, batch: dict, num_global_tokens: float, keep: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked NLL over a random subset of tokens: equal losses after resume need the
    workers' RNG state restored, not only weights and optimizer."""
    kept = (torch.rand(batch["token_mask"].shape) < keep).to(logprobs.dtype)
    loss = -(logprobs * batch["token_mask"] * kept).sum() / num_global_tokens
    return loss, {}


def scheduled_recipe():
    recipe = tiny_automodel_recipe()
    # NeMo RL's form: 2 linear warm-up steps, then cosine decay over the rest.
    scheduler = (
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.LinearLR",
            kwargs={"start_factor": 0.5, "end_factor": 1.0, "total_iters": 2},
        ),
        LrSchedulerCfg(
            name="torch.optim.lr_scheduler.CosineAnnealingLR",
            kwargs={"T_max": 6, "eta_min": 1.0e-4},
        ),
        LrSchedulerCfg(milestones=(2,)),
    )
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, scheduler=scheduler))


def test_resume_gives_identical_losses(ray_cluster, tiny_model_path, tmp_path):
    recipe = scheduled_recipe()
    loss_fn = functools.partial(dropout_nll_loss, keep=0.7)
    batches = [make_batch(seed) for seed in range(5)]
    checkpoint_dir = str(tmp_path / "step_3")

    first = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        for batch in batches[:3]:
            first.train(batch, loss_fn)
        first.save_checkpoint(checkpoint_dir, {"step": 3, "data_position": 24})
        continued = [first.train(batch, loss_fn) for batch in batches[3:]]
        continued_weights = first.group.call_same("run", full_weights)[0]
    finally:
        first.shutdown()

    resumed = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        extra_state = resumed.load_checkpoint(checkpoint_dir)
        states = resumed.collect_state()
        steps_after_load = [s["step"] for s in states]
        # each rank reports its own host memory (the driver sums them: actors are not its children)
        assert all(s["peak_host_rss_gb"] > 0.1 for s in states), states
        after_resume = [resumed.train(batch, loss_fn) for batch in batches[3:]]
        resumed_weights = resumed.group.call_same("run", full_weights)[0]
    finally:
        resumed.shutdown()

    assert extra_state == {"step": 3, "data_position": 24}
    assert steps_after_load == [3, 3]
    assert sorted(os.listdir(checkpoint_dir)) == [
        "dcp",
        "extra_state.json",
        "rank_00000.pt",
        "rank_00001.pt",
    ]
    assert [m["lr"] for m in after_resume] == [m["lr"] for m in continued]
    assert continued[0]["lr"] != continued[1]["lr"]  # the schedule is really moving
    for got, want in zip(after_resume, continued, strict=True):
        assert abs(got["loss"] - want["loss"]) <= 1e-6
        assert abs(got["grad_norm"] - want["grad_norm"]) <= 1e-6
    for name, want in continued_weights.items():
        torch.testing.assert_close(resumed_weights[name], want, atol=1e-6, rtol=0, msg=name)


def test_load_rejects_incomplete_checkpoint(tmp_path):
    from hpcrl.core.workers.ray_policy import RayPolicy

    (tmp_path / "half").mkdir()
    policy = RayPolicy.__new__(RayPolicy)  # the check runs before any worker is touched
    with pytest.raises(FileNotFoundError, match="extra_state.json missing"):
        policy.load_checkpoint(str(tmp_path / "half"))


def test_export_hf_from_tensor_parallel_reloads_with_same_logprobs(
    ray_cluster,
    tiny_model_path,
    tmp_path,
):
    recipe = tiny_automodel_recipe(tp=2)
    out_dir = str(tmp_path / "hf")
    batch = make_batch(seed=7)
    policy = start_policy(recipe, tiny_model_path, world_size=2)
    try:
        for seed in range(2):
            policy.train(make_batch(seed), masked_nll_loss)
        policy.export_hf(out_dir)
        live = policy.get_logprobs(batch)
    finally:
        policy.shutdown()

    exported = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        reloaded = reference_logprobs(exported, batch)
        untrained = reference_logprobs(initial, batch)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(reloaded[mask], live[mask], atol=1e-5, rtol=0)
    assert (reloaded[mask] - untrained[mask]).abs().max() > 1e-3  # trained weights were saved
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    assert tokenizer.decode(tokenizer("a+b=3").input_ids) == "a+b=3"
    with open(os.path.join(out_dir, "config.json")) as handle:
        assert json.load(handle)["model_type"] == "qwen2"
