"""FSDP2 over 2 Ray workers (gloo) matches one process: losses, grad norms, weights, log-probs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.core.parallel_harness import (
    full_weights,
    make_batch,
    masked_nll_loss,
    reference_logprobs,
    reference_training,
    start_policy,
)
from tests.recipe_builder import tiny_automodel_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fsdp_policy(ray_cluster, tiny_model_path):
    policy = start_policy(tiny_automodel_recipe(), tiny_model_path, world_size=2)
    yield policy
    policy.shutdown()


def test_fsdp_training_matches_single_process(fsdp_policy, tiny_model_path):
    recipe = tiny_automodel_recipe()
    batches = [make_batch(seed) for seed in range(4)]
    metrics = [fsdp_policy.train(batch, masked_nll_loss) for batch in batches]
    ref_losses, ref_weights = reference_training(tiny_model_path, recipe, batches)

    losses = [m["loss"] for m in metrics]
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert losses[-1] < losses[0]
    assert all(m["lr"] == recipe.policy.optimizer.lr for m in metrics)
    assert [m["num_tokens"] for m in metrics] == [float(b["token_mask"].sum()) for b in batches]
    weights = fsdp_policy.group.call_same("run", full_weights)[0]
    assert weights.keys() == ref_weights.keys()
    for name, ref in ref_weights.items():
        torch.testing.assert_close(weights[name], ref, atol=1e-5, rtol=0, msg=name)


def test_logprobs_come_back_in_batch_order(fsdp_policy, tiny_model_path):
    batch = make_batch(seed=11, batch_size=7)  # uneven over 2 ranks: padded, then trimmed
    current = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    current.load_state_dict(fsdp_policy.group.call_same("run", full_weights)[0])
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        expected_current = reference_logprobs(current, batch)
        expected_initial = reference_logprobs(initial, batch)

    got_current = fsdp_policy.get_logprobs(batch)
    got_initial = fsdp_policy.get_reference_logprobs(batch)

    assert got_current.shape == batch["input_ids"].shape
    assert torch.equal(got_current[:, 0], torch.zeros(7))
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got_current[mask], expected_current[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(got_initial[mask], expected_initial[mask], atol=1e-5, rtol=0)
