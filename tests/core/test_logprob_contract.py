"""The log-prob contract (issue 15, shared with the sampler): a token's log-prob is
``log_softmax(filter(logits / T))`` at that token, NeMo RL's ``processed_logprobs``.

The reference (``tests/core/logprob_reference.py``) is written from that formula, on the
logits of a plain Hugging Face forward. The torch sampler's
``generation_logprobs`` and the Automodel backend's log-prob path must both equal it, for
models whose HF forward post-processes its logits too (Gemma-2 soft-capping, Granite,
Cohere). Tolerance 2e-5 nats (float32 on CPU; observed ≤ 5e-6).
"""

from __future__ import annotations

import pytest

from tests.require import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from hpcrl.config.recipe import GenerationCfg  # noqa: E402
from hpcrl.core.backends.automodel.model import TokenLogprobModel  # noqa: E402
from hpcrl.core.generation.padding import pad_prompts  # noqa: E402
from hpcrl.core.generation.torch_sampler import generate  # noqa: E402
from hpcrl.core.models.tiny import ensure_tiny_model  # noqa: E402
from hpcrl.core.token_distribution import LogitTransform, TokenDistribution  # noqa: E402
from tests.core.logprob_reference import reference_logprobs  # noqa: E402

TOLERANCE = 2e-5
PROMPTS = ["Count: ", "What is 2+3? ", "a", "The quick brown fox"]
DISTRIBUTIONS = {
    "t1": GenerationCfg(temperature=1.0, max_new_tokens=10),
    "t0.7": GenerationCfg(temperature=0.7, max_new_tokens=10),
    "t1.3_topk5": GenerationCfg(temperature=1.3, top_k=5, max_new_tokens=10),
    "t0.8_topp0.9": GenerationCfg(temperature=0.8, top_p=0.9, max_new_tokens=10),
    "t0.6_topk8_topp0.7": GenerationCfg(temperature=0.6, top_k=8, top_p=0.7, max_new_tokens=10),
}


@pytest.fixture(scope="module")
def tiny():
    path = ensure_tiny_model("tiny:qwen2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tokenizer


def sample(model, tokenizer, cfg: GenerationCfg, seed: int = 3) -> dict:
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(3)]
    input_ids, attention_mask = pad_prompts(ids, tokenizer.pad_token_id)
    return generate(
        model,
        input_ids,
        attention_mask,
        cfg,
        seed=seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def hf_logits(model, out: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_sampler_and_automodel_logprobs_equal_the_reference(tiny, name) -> None:
    model, tokenizer = tiny
    cfg = DISTRIBUTIONS[name]
    out = sample(model, tokenizer, cfg)
    mask = out["response_mask"].bool()
    assert mask.sum() > 20
    want = reference_logprobs(hf_logits(model, out), out["input_ids"], cfg)
    assert torch.isfinite(want[mask]).all(), "a sampled token outside the kept set"
    gap = (out["generation_logprobs"][mask] - want[mask]).abs().max().item()
    assert gap < TOLERANCE, f"sampler vs reference: {gap}"

    # The Automodel backend's log-prob path (the FSDP root's code) on the same sequences.
    root = TokenLogprobModel(model)
    with torch.no_grad():
        processed, unfiltered = root(
            out["input_ids"],
            out["attention_mask"],
            distribution=TokenDistribution.of_generation(cfg),
        )
    assert (processed[mask] - want[mask]).abs().max().item() < TOLERANCE
    # and it equals the sampler's own record (the importance-sampling contract)
    assert (processed[mask] - out["generation_logprobs"][mask]).abs().max().item() < TOLERANCE
    want_unfiltered = reference_logprobs(hf_logits(model, out), out["input_ids"], cfg, False)
    assert (unfiltered[mask] - want_unfiltered[mask]).abs().max().item() < TOLERANCE


def test_temperature_changes_the_logprobs_it_is_not_a_no_op(tiny) -> None:
    """The comparison above can fail: at T = 0.7 the T = 1 values are off by far more."""
    model, tokenizer = tiny
    out = sample(model, tokenizer, DISTRIBUTIONS["t0.7"])
    mask = out["response_mask"].bool()
    at_one = reference_logprobs(hf_logits(model, out), out["input_ids"], DISTRIBUTIONS["t1"])
    assert (out["generation_logprobs"][mask] - at_one[mask]).abs().max().item() > 0.05


def test_greedy_records_temperature_one_logprobs(tiny) -> None:
    model, tokenizer = tiny
    cfg = GenerationCfg(temperature=0.0, max_new_tokens=6)
    out = sample(model, tokenizer, cfg)
    mask = out["response_mask"].bool()
    want = reference_logprobs(hf_logits(model, out), out["input_ids"], DISTRIBUTIONS["t1"])
    assert (out["generation_logprobs"][mask] - want[mask]).abs().max().item() < TOLERANCE


# --------------------------------------------------------------------------- model logit processing
SMALL = dict(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def build(kind: str):
    """A random-init model whose lm_head is scaled up so logits span several nats (where
    soft-capping at 3 bends them)."""
    torch.manual_seed(0)
    if kind == "gemma2":
        config = transformers.Gemma2Config(
            **SMALL, head_dim=8, final_logit_softcapping=3.0, tie_word_embeddings=False
        )
        model = transformers.Gemma2ForCausalLM(config)
    elif kind == "granite":
        model = transformers.GraniteForCausalLM(
            transformers.GraniteConfig(**SMALL, logits_scaling=0.25)
        )
    else:
        model = transformers.CohereForCausalLM(transformers.CohereConfig(**SMALL, logit_scale=4.0))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30.0)
    return model.eval()


@pytest.mark.parametrize(
    "kind, transform",
    [
        ("gemma2", LogitTransform(softcap=3.0)),
        ("granite", LogitTransform(multiplier=4.0)),
        ("cohere", LogitTransform(multiplier=4.0)),
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_automodel_applies_the_models_own_logit_processing(kind, transform, temperature) -> None:
    model = build(kind)
    assert LogitTransform.of_config(model.config) == transform
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    cfg = GenerationCfg(temperature=temperature)
    with torch.no_grad():
        want = reference_logprobs(model(input_ids=ids, attention_mask=mask).logits, ids, cfg)
        got, _ = TokenLogprobModel(model)(
            ids, mask, distribution=TokenDistribution(temperature=temperature)
        )
        # what the backend computed before issue 15: lm_head output, no processing
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        raw = hidden @ model.get_output_embeddings().weight.T
        unprocessed = reference_logprobs(raw, ids, cfg)
    assert (got - want).abs().max().item() < TOLERANCE
    assert (unprocessed - want).abs().max().item() > 0.05  # the processing matters here
