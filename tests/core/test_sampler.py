"""hpcrl's batched KV-cache sampler against Hugging Face generate and a teacher-forced forward."""

from __future__ import annotations

import pytest

from tests.require import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from hpcrl.config.recipe import GenerationCfg  # noqa: E402
from hpcrl.core.generation.padding import pad_prompts  # noqa: E402
from hpcrl.core.generation.torch_sampler import generate  # noqa: E402
from hpcrl.core.models.tiny import ensure_tiny_model  # noqa: E402

PROMPTS = ["Count: ", "What is 2+3? ", "a", "The quick brown fox jumps"]


@pytest.fixture(scope="module")
def tiny() -> tuple:
    path = ensure_tiny_model("tiny:qwen2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tokenizer


def _run(model, tokenizer, cfg: GenerationCfg, seed: int = 0, prompts=PROMPTS) -> dict:
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    input_ids, attention_mask = pad_prompts(ids, tokenizer.pad_token_id)
    return generate(
        model,
        input_ids,
        attention_mask,
        cfg,
        seed=seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tokenizer=tokenizer,
    )


def _responses(out: dict) -> list[list[int]]:
    rows = []
    for row in range(out["input_ids"].shape[0]):
        mask = out["response_mask"][row].bool()
        rows.append(out["input_ids"][row][mask].tolist())
    return rows


def test_greedy_equals_hf_generate(tiny) -> None:
    model, tokenizer = tiny
    out = _run(model, tokenizer, GenerationCfg(temperature=0.0, max_new_tokens=12))
    tokenizer.padding_side = "left"
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    hf = model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=12,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    hf_new = hf[:, batch["input_ids"].shape[1] :]
    ours = _responses(out)
    for row, response in enumerate(ours):
        assert response == hf_new[row, : len(response)].tolist()
        assert len(response) == 12 or response[-1] == tokenizer.eos_token_id
    # the prompt sits at the start of every row, right-padded after the response
    for row, prompt in enumerate(PROMPTS):
        prompt_ids = tokenizer(prompt)["input_ids"]
        assert out["input_ids"][row, : len(prompt_ids)].tolist() == prompt_ids
        assert int(out["prompt_lengths"][row]) == len(prompt_ids)
        total = len(prompt_ids) + int(out["response_lengths"][row])
        assert out["attention_mask"][row].tolist() == [1] * total + [0] * (
            out["input_ids"].shape[1] - total
        )


def test_logprobs_equal_teacher_forced_forward(tiny) -> None:
    model, tokenizer = tiny
    cfg = GenerationCfg(temperature=1.0, max_new_tokens=10)
    out = _run(model, tokenizer, cfg, seed=3)
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    taken = logp.gather(2, out["input_ids"][:, 1:, None])[:, :, 0]
    teacher = torch.cat([torch.zeros(taken.shape[0], 1), taken], dim=1)
    mask = out["response_mask"].bool()
    assert mask.sum() > 0
    diff = (teacher[mask] - out["generation_logprobs"][mask]).abs().max().item()
    assert diff < 1e-5
    assert (out["generation_logprobs"][~mask] == 0).all()


def test_stop_token_stops_each_row_at_its_first_occurrence(tiny) -> None:
    model, tokenizer = tiny
    greedy = _responses(_run(model, tokenizer, GenerationCfg(temperature=0.0, max_new_tokens=8)))
    stop_id = greedy[0][2]
    cfg = GenerationCfg(temperature=0.0, max_new_tokens=8, stop_token_ids=(stop_id,))
    stopped = _responses(_run(model, tokenizer, cfg))
    for full, cut in zip(greedy, stopped, strict=True):
        expected = full[: full.index(stop_id) + 1] if stop_id in full else full
        assert cut == expected
    assert len(stopped[0]) <= 3


def test_stop_string_stops_after_the_text_appears(tiny) -> None:
    model, tokenizer = tiny
    greedy = _responses(_run(model, tokenizer, GenerationCfg(temperature=0.0, max_new_tokens=8)))
    stop_text = tokenizer.decode(greedy[1][1:3])
    cfg = GenerationCfg(temperature=0.0, max_new_tokens=8, stop_strings=(stop_text,))
    stopped = _responses(_run(model, tokenizer, cfg))
    assert stopped[1] == greedy[1][:3]
    for full, cut in zip(greedy, stopped, strict=True):
        assert cut == full[: len(cut)]
        text = tokenizer.decode(cut)
        assert stop_text in text or cut == full
        assert stop_text not in tokenizer.decode(cut[:-1])


def test_tiny_top_p_and_top_k_1_equal_greedy(tiny) -> None:
    model, tokenizer = tiny
    greedy = _responses(_run(model, tokenizer, GenerationCfg(temperature=0.0, max_new_tokens=8)))
    top_p = GenerationCfg(temperature=1.0, top_p=1e-9, max_new_tokens=8)
    top_k = GenerationCfg(temperature=1.3, top_k=1, max_new_tokens=8)
    assert _responses(_run(model, tokenizer, top_p, seed=5)) == greedy
    assert _responses(_run(model, tokenizer, top_k, seed=6)) == greedy


def test_sampling_is_reproducible_per_seed_and_differs_across_seeds(tiny) -> None:
    model, tokenizer = tiny
    cfg = GenerationCfg(temperature=1.0, max_new_tokens=10)
    first = _responses(_run(model, tokenizer, cfg, seed=11))
    again = _responses(_run(model, tokenizer, cfg, seed=11))
    other = _responses(_run(model, tokenizer, cfg, seed=12))
    assert first == again
    assert first != other


def test_sampled_token_frequencies_follow_the_model_distribution(tiny) -> None:
    """Temperature 1 sampling of one token: empirical frequencies ≈ softmax probabilities."""
    model, tokenizer = tiny
    prompt = tokenizer("x")["input_ids"]
    num_samples = 4000
    cfg = GenerationCfg(temperature=1.0, max_new_tokens=1)
    out = _run(model, tokenizer, cfg, seed=1, prompts=["x"] * num_samples)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1], dim=-1)
    counts = torch.bincount(out["input_ids"][:, len(prompt)], minlength=probs.shape[0])
    top = probs.argsort(descending=True)[:5]
    freq = counts[top].float() / num_samples
    # binomial std ≤ sqrt(0.25/4000) ≈ 0.008; 4 sigma
    assert (freq - probs[top]).abs().max().item() < 0.035
