"""The torch engine on a GPU when a call's wave is larger than the last one's: the decode
state is allocated again and every decode step captured again. Before the fix the captures
of the larger wave reused the graph memory pool of the released graphs and failed (torch
2.11 on an H100: ``it->second->use_count > 0`` INTERNAL ASSERT in the caching allocator,
seen in benchmarks/prefill_profile.py at batch 256 after batch 64, 2026-12-06). The larger
wave also crosses the decode attention's switch of launch (``launch_for_rows``: the
tensor-core launch from 128 rows), so both launches run in one engine here."""

from __future__ import annotations

import pytest

from tests.require import require_module

pytestmark = pytest.mark.gpu

torch = require_module("torch")


def _greedy_tokens(engine, prompts: list[list[int]]) -> list[list[int]]:
    from hpcrl.config.recipe import GenerationCfg

    out = engine.generate(prompts, GenerationCfg(temperature=0.0, max_new_tokens=12), seed=0)
    mask = out["response_mask"].bool()
    return [row[keep].tolist() for row, keep in zip(out["input_ids"], mask, strict=True)]


def test_a_larger_wave_after_a_smaller_one_generates_what_a_fresh_engine_does() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from hpcrl.core.generation.decode_launch import TENSOR_CORE_MIN_ROWS
    from hpcrl.core.generation.torch_engine import TorchEngine

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to("cuda", torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 20, (TENSOR_CORE_MIN_ROWS + 32,), generator=gen).tolist()
    prompts = [torch.randint(4, 512, (n,), generator=gen).tolist() for n in lengths]

    grown = TorchEngine.from_hf_model(model, max_model_len=64)
    small = _greedy_tokens(grown, prompts[:8])
    large = _greedy_tokens(grown, prompts)  # more rows: new state, new captures
    assert grown.last_stats.graph_captures > 0
    fresh = TorchEngine.from_hf_model(model, max_model_len=64)
    assert large == _greedy_tokens(fresh, prompts)
    assert small == _greedy_tokens(fresh, prompts[:8])
