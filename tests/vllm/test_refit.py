"""Weight refit of a running engine: generation follows the new weights (and equals the
torch sampler on a model holding them), and returns exactly to the old outputs when the old
weights come back."""

from __future__ import annotations

import pytest
import torch

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.vllm_engine import VllmEngine
from tests.vllm.harness import VLLM_CFG, build_tiny_model, encode, responses, torch_sampler_generate

GREEDY = GenerationCfg(temperature=0.0, max_new_tokens=16)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(path)


def _perturbed(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight scaled and shifted by a fixed pattern (a stand-in for a training step)."""
    gen = torch.Generator().manual_seed(7)
    return {
        name: tensor * 1.5 + 0.05 * torch.randn(tensor.shape, generator=gen)
        for name, tensor in model.state_dict().items()
    }


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "multiprocess"])
def test_refit_follows_new_weights_and_restores_exactly(tiny, in_process: bool) -> None:
    path, model, tokenizer = tiny
    prompts = encode(tokenizer)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = VllmEngine(path, VLLM_CFG, device="cpu", in_process=in_process)
    try:
        before = engine.generate(prompts, GREEDY, seed=0)
        new_weights = _perturbed(model)
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
