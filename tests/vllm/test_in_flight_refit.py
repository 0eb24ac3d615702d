"""In-flight weight updates (``grpo.async_grpo.in_flight_weight_updates``) on the real vLLM
engine: a refit issued from another thread while a generation runs lands between two of its
decode steps; the tokens before it come from the old weights and those after it from the
new ones, to teacher-forced parity with the new model when the KV caches are recomputed
(``recompute_kv_cache_after_weight_updates``), and from new weights over the old cache when
they are not. The next generation sees no prefix cached by the old weights."""

from __future__ import annotations

import time

import pytest
import torch

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.vllm_engine import VllmEngine
from tests.in_flight_gate import refit_at_step
from tests.vllm.harness import (
    VLLM_CFG,
    encode,
    perturbed,
    response_logprobs,
    responses,
    teacher_forced_logprobs,
    vllm_spec,
)

# temperature 1, no top-k/top-p: the sampler's log-probs are the model's raw ones, which a
# teacher-forced HF forward gives (tests/vllm/test_engine.py holds vLLM to 2e-4 of it).
SAMPLING = GenerationCfg(temperature=1.0, max_new_tokens=48)
REFIT_AFTER_STEPS = 6
ATOL = 2e-4


def _refit_mid_generation(
    engine: VllmEngine, prompts: list[list[int]], new_weights: dict, recompute: bool
) -> tuple[dict, list[bool]]:
    """Generate on this thread; from a second thread, at the REFIT_AFTER_STEPS-th decode step
    boundary, refit in flight. Returns the output and what the refit call returned."""
    with refit_at_step(
        engine,
        REFIT_AFTER_STEPS,
        lambda: engine.update_weights_in_flight(new_weights.items(), recompute),
        timeout_s=300,
    ) as landed:
        out = engine.generate(prompts, SAMPLING, seed=5)
    return out, landed


def _split_by_refit(positions: list[list[int]], out: dict) -> list[tuple[int, torch.Tensor]]:
    """(refit position, that row's sampler log-probs) of every row still running at the refit."""
    return [
        (at[0], logprobs)
        for at, logprobs in zip(positions, response_logprobs(out), strict=True)
        if at
    ]


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute-kv", "stale-kv"])
def test_refit_lands_mid_generation_and_later_tokens_use_the_new_weights(
    tiny, recompute: bool
) -> None:
    path, model, tokenizer = tiny
    prompts = encode(tokenizer)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    new_weights = perturbed(model, seed=11)
    engine = VllmEngine(vllm_spec(path), in_process=True)
    try:
        out, landed = _refit_mid_generation(engine, prompts, new_weights, recompute)
        refits_in_flight = engine.generation_metrics()["generation_refits_in_flight"]
        positions = [list(p) for p in engine.last_refit_positions]
        after = engine.generate(prompts, SAMPLING, seed=6)  # a generation started after it
        version = engine.weights_version
    finally:
        engine.shutdown()

    assert landed == [True] and refits_in_flight == 1 and version == 1
    split = _split_by_refit(positions, out)
    lengths = [len(r) for r in responses(out)]
    # The rows still running at the refit (a random model ends one in ~100 tokens with EOS)
    # got it after some of their tokens, before their last.
    assert len(split) >= 12, positions
    running = [row for row, at in enumerate(positions) if at]
    assert all(0 < positions[row][0] < lengths[row] for row in running), (positions, lengths)
    old_forced = [response_logprobs_of(model, out)[row] for row in running]
    model.load_state_dict(new_weights)
    try:
        new_forced = [response_logprobs_of(model, out)[row] for row in running]
        after_forced = response_logprobs_of(model, after)
    finally:
        model.load_state_dict(original)

    post_vs_new, post_vs_old = [], []
    for (at, sampled), old, new in zip(split, old_forced, new_forced, strict=True):
        # Before the refit: the old weights, to the precision of a fresh engine.
        torch.testing.assert_close(sampled[:at], old[:at], atol=ATOL, rtol=0)
        post_vs_new.append((sampled[at:] - new[at:]).abs().max().item())
        post_vs_old.append((sampled[at:] - old[at:]).abs().mean().item())
    # After it: not the old weights' log-probs (the perturbation moves them by ~1 nat).
    assert min(post_vs_old) > 0.05, post_vs_old
    if recompute:
        # Caches recomputed with the new weights: exactly a fresh model holding them.
        assert max(post_vs_new) < ATOL, post_vs_new
    else:
        # The earlier tokens stay as the old weights cached them: not the fresh new model.
        assert max(post_vs_new) > 1e-2, post_vs_new
    # The next generation reads no prefix the old weights cached: the new model exactly.
    for sampled, forced in zip(response_logprobs(after), after_forced, strict=True):
        torch.testing.assert_close(sampled, forced, atol=ATOL, rtol=0)


def test_engine_actor_refits_beside_its_running_generation(ray_cluster, tiny) -> None:
    """Through Ray, as async GRPO drives it: a generation running, a second one queued behind
    it; the in-flight refit lands inside the first (not between the two, where a plain
    refit would queue), and the second samples from the new weights alone."""
    import ray

    from hpcrl.core.generation.engine import EngineSpec
    from hpcrl.core.workers.vllm_workers import REFIT_GROUP, GenerationGroup, GenerationLayout

    path, model, tokenizer = tiny
    prompts = encode(tokenizer)
    spec = EngineSpec(
        backend="vllm", model_path=path, tokenizer_path=path, device="cpu",
        precision="float32", seed=0, max_model_len=None, vllm_cfg=VLLM_CFG,
    )  # fmt: skip
    layout = GenerationLayout(
        first_node=0, num_nodes=1, engines_per_node=1, gpus_per_engine=0, device="cpu"
    )
    new_weights = perturbed(model, seed=11)
    group = GenerationGroup(layout, spec)
    group.start()
    try:
        first = group.submit(prompts, SAMPLING, seed=5)
        second = group.submit(prompts, SAMPLING, seed=6)  # queued behind the first
        steps = group.actors[0].decode_steps.options(concurrency_group=REFIT_GROUP)
        deadline = time.monotonic() + 300
        while ray.get(steps.remote()) < REFIT_AFTER_STEPS and time.monotonic() < deadline:
            time.sleep(0.05)
        group.update_weights_in_flight(ray.put(list(new_weights.items())), 1, True)
        group.wait_for_updates()
        (first_shard,), (second_shard,) = group.collect(first), group.collect(second)
    finally:
        group.shutdown()

    assert first_shard.metrics["generation_refits_in_flight"] == 1
    assert second_shard.metrics["generation_refits_in_flight"] == 0
    assert group.weights_version == 1
    original = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(new_weights)
    try:
        forced = response_logprobs_of(model, second_shard.fields)
    finally:
        model.load_state_dict(original)
    for sampled, want in zip(response_logprobs(second_shard.fields), forced, strict=True):
        torch.testing.assert_close(sampled, want, atol=ATOL, rtol=0)


def response_logprobs_of(model: torch.nn.Module, out: dict) -> list[torch.Tensor]:
    """Teacher-forced log-probs of each row's response tokens under ``model``."""
    forced = teacher_forced_logprobs(model, out)
    return [
        forced[row][out["response_mask"][row].bool()] for row in range(out["input_ids"].shape[0])
    ]
