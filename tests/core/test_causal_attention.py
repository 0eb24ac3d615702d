"""hpcrl.core.backends.automodel.causal_attention: mask-less causal SDPA gives the log-probs
and gradients transformers' own SDPA path gives (causal rows, a pack's sequences, padding on
the left), without transformers' mask construction; and only for configs without local
attention layers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import masking_utils

from hpcrl.core.backends.automodel.causal_attention import (
    CAUSAL_ATTENTION,
    all_layers_causal,
    apply_causal_attention,
)
from hpcrl.core.backends.automodel.model import TokenLogprobModel

VOCAB = 64


def tiny(model_type: str, **more: Any) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=False, initializer_range=0.3, **more,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")


@pytest.mark.parametrize(
    ("model_type", "more", "causal"),
    [
        ("llama", {}, True),
        ("qwen2", {}, True),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}, False),
        ("qwen3", {}, True),
        ("mistral", {"sliding_window": None}, True),
        ("mistral", {"sliding_window": 8}, False),
        ("gemma2", {}, False),  # local layers
        ("gpt2", {}, False),  # not a family on the list
    ],
)
def test_only_configs_without_local_attention(model_type: str, more: dict, causal: bool) -> None:
    from transformers import AutoConfig

    assert all_layers_causal(AutoConfig.for_model(model_type, **more)) is causal


def counted_mask_construction(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of transformers' packed-sequence detection (the first step of its mask
    construction when no mask is given)."""
    calls = [0]
    original = masking_utils.find_packed_sequence_indices

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", counting)
    return calls


def both_models(model_type: str) -> tuple[TokenLogprobModel, TokenLogprobModel]:
    """The same weights on transformers' SDPA and on ``CAUSAL_ATTENTION``."""
    plain = tiny(model_type)
    switched = copy.deepcopy(plain)
    assert apply_causal_attention(switched)
    assert switched.config._attn_implementation == CAUSAL_ATTENTION
    return TokenLogprobModel(plain), TokenLogprobModel(switched)


def logprobs_and_grads(model: TokenLogprobModel, call: dict, valid: torch.Tensor) -> tuple:
    model.zero_grad(set_to_none=True)
    processed, _ = model(**call)
    (processed * valid).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return processed.detach(), grads


def scored(mask: torch.Tensor) -> torch.Tensor:
    """Real tokens whose previous token is real too."""
    return (mask * torch.nn.functional.pad(mask[:, :-1], (1, 0))).float()


def cases() -> dict[str, tuple[dict, torch.Tensor]]:
    """name -> (the model's keyword arguments, which tokens are real)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 12), generator=gen)
    left = (torch.arange(12)[None] >= torch.tensor([0, 4, 9])[:, None]).long()
    pack = torch.randint(1, VOCAB, (1, 12), generator=gen)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    return {
        "causal": ({"input_ids": ids, "attention_mask": None}, torch.ones(3, 12)),
        # a row's first real token is scored from a padding query's output: not compared
        "left-padded": ({"input_ids": ids * left, "attention_mask": left}, scored(left)),
        "pack": (
            {"input_ids": pack, "attention_mask": None, "position_ids": positions},
            torch.ones(1, 12),
        ),
    }


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("case", ["causal", "left-padded", "pack"])
def test_same_logprobs_and_gradients_without_mask_construction(
    model_type: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, switched = both_models(model_type)
    call, valid = cases()[case]
    calls = counted_mask_construction(monkeypatch)
    expected, expected_grads = logprobs_and_grads(plain, call, valid)
    built_by_transformers = calls[0]
    got, grads = logprobs_and_grads(switched, call, valid)
    if call["attention_mask"] is None:  # transformers builds one from the positions
        assert built_by_transformers > 0
    assert calls[0] == built_by_transformers  # none by the switched model
    real = valid.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    assert got[real].std() > 0.1  # attention matters to these log-probs
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-5)


def test_a_pack_without_its_sequence_boundaries_differs() -> None:
    """The pack case can fail: the same tokens as one causal row give other log-probs."""
    _, switched = both_models("llama")
    call, _ = cases()["pack"]
    packed, _ = switched(**call)
    one_row, _ = switched(call["input_ids"], None)
    assert (packed[0, 5:] - one_row[0, 5:]).abs().max() > 1e-2


def test_saved_config_keeps_no_trace_of_the_switch(tmp_path: Path) -> None:
    _, switched = both_models("llama")
    switched.hf.save_pretrained(tmp_path)
    assert CAUSAL_ATTENTION not in json.loads((tmp_path / "config.json").read_text()).values()
