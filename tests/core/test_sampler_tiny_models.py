"""Tiny local models: built once, atomically, deterministic, loadable through HF's real code."""

from __future__ import annotations

import threading

import pytest

from tests.require import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from hpcrl.core.models.tiny import ensure_tiny_model, resolve_model_path  # noqa: E402


def test_concurrent_builds_share_one_folder_and_equal_weights(tmp_path) -> None:
    results: list[str] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(ensure_tiny_model("tiny:llama", str(tmp_path)))
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    built = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert built == ["tiny-llama-v1"]  # no leftover temporary folders
    other = tmp_path / "again"
    again = ensure_tiny_model("tiny:llama", str(other))
    first = transformers.AutoModelForCausalLM.from_pretrained(results[0]).state_dict()
    second = transformers.AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_tokenizer_round_trips_text_and_knows_its_special_tokens() -> None:
    from hpcrl.core.models.tokenizer import load_tokenizer

    path = ensure_tiny_model("tiny:qwen2")
    tokenizer = load_tokenizer(path)  # what the jobs use, on transformers 4 and 5
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    text = "What is 12 + 30? The answer is \\boxed{42}.\nOK!"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no specials added
    assert tokenizer.decode(ids) == text
    assert model.config.vocab_size == len(tokenizer)
    assert {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id} == {0, 1, 2}
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_resolver_builds_tiny_names_and_passes_others_through(tmp_path) -> None:
    assert resolve_model_path("/models/qwen2-1.5b") == "/models/qwen2-1.5b"
    assert resolve_model_path("Qwen/Qwen2-1.5B") == "Qwen/Qwen2-1.5B"
    path = resolve_model_path("tiny:qwen2", cache_dir=str(tmp_path))
    assert path.startswith(str(tmp_path))
    with pytest.raises(ValueError, match="tiny:qwen2, tiny:llama, tiny:llama-1b"):
        resolve_model_path("tiny:gpt5")


def test_llama_1b_spec_is_the_benchmark_shape_without_building_it() -> None:
    from hpcrl.core.models.tiny import TINY_SPECS, tiny_config

    spec = TINY_SPECS["llama-1b"]
    config = tiny_config(spec, spec.vocab_size)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    num_params = sum(p.numel() for p in model.parameters())
    # 16 × (4·2048² attention + 3·2048·5632 MLP + 2·2048 norms) + 2·32000·2048 + 2048
    expected = 16 * (4 * 2048**2 + 3 * 2048 * 5632 + 2 * 2048) + 2 * 32000 * 2048 + 2048
    assert num_params == expected
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (
        16,
        2048,
        16,
    )


def test_a_bf16_spec_is_saved_in_bf16_with_its_shape_and_the_8b_one_is_llama_31s(
    tmp_path, monkeypatch
) -> None:
    """The 8B spec's shape is Llama-3.1-8B's; a bf16 spec (a small stand-in for it: 16 GB is
    no CPU test) is built, saved in bf16 safetensors and loads back through HF with its rope
    theta. On this CPU machine it builds in this process (on a GPU: a spawned one)."""
    import attrs
    from safetensors import safe_open

    from hpcrl.core.models import tiny

    big = tiny.TINY_SPECS["llama3.1-8b"]
    config = tiny.tiny_config(big, big.vocab_size)
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
             config.num_key_value_heads, config.intermediate_size, config.vocab_size)  # fmt: skip
    assert shape == (4096, 32, 32, 8, 14336, 128256) and big.dtype == "bfloat16"
    assert _rope_theta(config) == 500000.0
    three = tiny.TINY_SPECS["llama3.2-3b"]  # Llama-3.2-3B's shape, its embeddings tied
    config = tiny.tiny_config(three, three.vocab_size)
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
             config.num_key_value_heads, config.intermediate_size, config.vocab_size)  # fmt: skip
    assert shape == (3072, 28, 24, 8, 8192, 128256) and config.tie_word_embeddings
    small = attrs.evolve(big, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=512)  # fmt: skip
    monkeypatch.setitem(tiny.TINY_SPECS, "bf16-small", small)
    assert not tiny.builds_on_gpu(small)  # no CUDA here
    folder = tiny.ensure_tiny_model("tiny:bf16-small", str(tmp_path))
    (weights,) = [p for p in tmp_path.rglob("*.safetensors")]
    with safe_open(weights, "pt") as stored:
        dtypes = {stored.get_slice(name).get_dtype() for name in stored.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert _rope_theta(model.config) == 500000.0 and model.config.num_key_value_heads == 2


def _rope_theta(config) -> float:
    """rope_theta where this transformers keeps it (5.x moved it into rope_parameters)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 0.0)))
