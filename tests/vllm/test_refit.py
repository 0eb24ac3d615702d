"""Weight refit of a running engine: generation follows the new weights (and equals the
torch sampler on a model holding them), and returns exactly to the old outputs when the old
weights come back."""

from __future__ import annotations

import pytest
import torch

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.vllm_engine import VllmEngine
from tests.vllm.harness import VLLM_CFG, encode, perturbed, responses, torch_sampler_generate

GREEDY = GenerationCfg(temperature=0.0, max_new_tokens=16)


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "multiprocess"])
def test_refit_follows_new_weights_and_restores_exactly(tiny, in_process: bool) -> None:
    path, model, tokenizer = tiny
    prompts = encode(tokenizer)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = VllmEngine(path, VLLM_CFG, device="cpu", in_process=in_process)
    try:
        before = engine.generate(prompts, GREEDY, seed=0)
        new_weights = perturbed(model, seed=7)
        engine.update_weights(new_weights.items())
        after = engine.generate(prompts, GREEDY, seed=0)
        engine.update_weights(list(original.items()))
        restored = engine.generate(prompts, GREEDY, seed=0)
    finally:
        engine.shutdown()

    changed = sum(a != b for a, b in zip(responses(before), responses(after), strict=True))
    assert changed >= 12, f"only {changed}/16 greedy outputs changed with new weights"
    model.load_state_dict(new_weights)
    try:
        assert responses(after) == responses(
            torch_sampler_generate(model, tokenizer, prompts, GREEDY)
        )
    finally:
        model.load_state_dict(original)
    for key in before:
        assert torch.equal(restored[key], before[key]), key
