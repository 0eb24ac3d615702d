"""In-flight weight updates on hpcrl's torch engine (``hpcrl.core.generation.in_flight``): a
refit from another thread lands between two decode steps of the running wave; tokens before
it are the old weights', tokens after it the new weights' (with the cache prefilled again:
exactly a fresh engine's teacher-forced log-probs on the new weights; without: new weights
over the old cache, neither model's)."""

from __future__ import annotations

import pytest

from tests.in_flight_gate import refit_at_step
from tests.require import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from hpcrl.config.recipe import GenerationCfg  # noqa: E402
from hpcrl.core.generation.torch_engine import TorchEngine  # noqa: E402
from hpcrl.core.models.tiny import ensure_tiny_model  # noqa: E402

PROMPTS = ["Count: ", "What is 2+3? ", "a", "The quick brown fox jumps", "7*6=", "xyz"]
SAMPLING = GenerationCfg(temperature=1.0, max_new_tokens=40)
REFIT_AFTER_STEPS = 8

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def qwen2() -> tuple:
    path = ensure_tiny_model("tiny:qwen2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tokenizer


def _perturbed(model) -> dict:
    gen = torch.Generator().manual_seed(3)
    return {
        name: t * 1.3 + 0.05 * torch.randn(t.shape, generator=gen)
        for name, t in model.state_dict().items()
    }


def _forced(model, out: dict) -> list:
    """Teacher-forced log-probs of every row's response tokens under ``model``."""
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits
    picked = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, out["input_ids"][:, 1:, None])
    forced = torch.cat([torch.zeros(picked.shape[0], 1), picked[..., 0]], dim=1)
    return [forced[r][out["response_mask"][r].bool()] for r in range(forced.shape[0])]


def _generate_with_refit(
    engine: TorchEngine, ids: list, weights: dict, recompute: bool, after: int = REFIT_AFTER_STEPS
):
    with refit_at_step(
        engine, after, lambda: engine.update_weights_in_flight(weights.items(), recompute)
    ) as landed:
        # No stop tokens: every row runs all 40 steps, so the refit finds all of them running.
        out = engine.generate(ids, SAMPLING, seed=2, stop_token_ids=())
    return out, landed


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute-kv", "stale-kv"])
def test_torch_engine_refit_in_flight(qwen2, recompute: bool) -> None:
    model, tokenizer = qwen2
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    new_weights = _perturbed(model)
    engine = TorchEngine.from_hf_model(model)
    out, landed = _generate_with_refit(engine, ids, new_weights, recompute)
    metrics = engine.generation_metrics()

    assert landed == [True]
    assert metrics["generation_refits_in_flight"] == 1
    assert metrics["generation_kv_recomputes"] == (1 if recompute else 0)
    positions = engine.last_refit_positions
    assert len({tuple(p) for p in positions}) == 1 and len(positions[0]) == 1, positions
    at = positions[0][0]
    assert REFIT_AFTER_STEPS <= at < 40, at
    old = _forced(model, out)
    fresh = transformers.AutoModelForCausalLM.from_config(model.config).eval()
    fresh.load_state_dict(new_weights)
    new = _forced(fresh, out)
    sampled = [
        out["generation_logprobs"][r][out["response_mask"][r].bool()] for r in range(len(ids))
    ]
    for row in range(len(ids)):
        torch.testing.assert_close(sampled[row][:at], old[row][:at], atol=1e-4, rtol=0)
        assert (sampled[row][at:] - old[row][at:]).abs().mean() > 0.05
        post_vs_new = (sampled[row][at:] - new[row][at:]).abs().max().item()
        if recompute:
            assert post_vs_new < 1e-4, (row, post_vs_new)
        else:
            assert post_vs_new > 1e-2, (row, post_vs_new)
    # The next call samples from the new weights alone.
    again = engine.generate(ids, SAMPLING, seed=3)
    for got, want in zip(
        [again["generation_logprobs"][r][again["response_mask"][r].bool()] for r in range(6)],
        _forced(fresh, again),
        strict=True,
    ):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert engine.generation_metrics()["generation_refits_in_flight"] == 0


def test_torch_engine_refit_while_idle_applies_at_once(qwen2) -> None:
    model, _ = qwen2
    engine = TorchEngine.from_hf_model(model)
    version = engine.weights_version
    assert engine.update_weights_in_flight(_perturbed(model).items(), True) is False
    assert engine.weights_version == version + 1


def test_recompute_after_rows_left_the_wave_keeps_each_row_on_its_own_tokens(qwen2) -> None:
    """Rows capped by the context finish early and the wave is compacted (slots reordered)
    before the refit: the cache prefilled again must put each live row's own prompt and
    tokens in its slot, so its later tokens are exactly the new model's."""
    from hpcrl.core.generation.torch_engine import EngineOptions

    model, tokenizer = qwen2
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    longest = max(len(i) for i in ids)
    engine = TorchEngine.from_hf_model(
        model, max_model_len=longest + 12, options=EngineOptions(check_every_tokens=4)
    )
    limits = engine.new_token_limits(ids, SAMPLING.max_new_tokens)
    new_weights = _perturbed(model)
    out, landed = _generate_with_refit(engine, ids, new_weights, recompute=True, after=30)
    metrics = engine.generation_metrics()

    assert landed == [True] and metrics["generation_kv_recomputes"] == 1
    assert metrics["generation_compactions"] >= 1  # slots were reordered before the refit
    assert out["response_lengths"].tolist() == limits
    positions = engine.last_refit_positions
    (at,) = {p[0] for p in positions if p}
    assert at >= 30
    # Rows that had finished got no refit; every row still running got it at the same token.
    assert [bool(p) for p in positions] == [limit > at for limit in limits]
    assert sum(limit > at for limit in limits) >= 2 and sum(limit <= at for limit in limits) >= 2
    old = _forced(model, out)
    fresh = transformers.AutoModelForCausalLM.from_config(model.config).eval()
    fresh.load_state_dict(new_weights)
    new = _forced(fresh, out)
    for row in range(len(ids)):
        sampled = out["generation_logprobs"][row][out["response_mask"][row].bool()]
        torch.testing.assert_close(sampled[:at], old[row][:at], atol=1e-4, rtol=0)
        if positions[row]:
            torch.testing.assert_close(sampled[at:], new[row][at:], atol=1e-4, rtol=0)
