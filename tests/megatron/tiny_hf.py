"""Tiny Hugging Face checkpoints built locally for the Megatron tests (no hub access).

Random init from a seed, a character-level tokenizer saved beside the weights (megatron-bridge
reads the tokenizer when it exports back to HF).
"""

from __future__ import annotations

import string
from pathlib import Path

VOCAB_SIZE = 128  # divisible by TP=2 and by megatron's padding; covers printable ASCII


def _save_char_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>"]
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    assert len(vocab) <= VOCAB_SIZE
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        unk_token="<|unk|>",
    )
    fast.save_pretrained(out_dir)


def build_tiny_hf_model(out_dir: Path, model_type: str, seed: int = 1234) -> Path:
    """Write a 2-layer, hidden-64 ``model_type`` ("llama" | "qwen2" | "qwen3") checkpoint to
    ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[model_type]
    # Qwen3's head_dim defaults to 128 rather than hidden_size / heads
    extra = {"head_dim": 16} if model_type == "qwen3" else {}
    config = config_cls(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        torch_dtype="float32",
        rms_norm_eps=1e-6,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_char_tokenizer(out_dir)
    return out_dir
