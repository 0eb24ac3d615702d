"""Tiny Hugging Face models built locally (no hub): the embedded demo and the tests train them.

``ensure_tiny_model("tiny:qwen2")`` returns a folder holding a randomly initialised (seeded,
so identical on every machine) HF checkpoint and a character-level tokenizer beside it; both
load back through ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``,
the same code path a real checkpoint takes. A model is built once per cache folder; concurrent
workers wait on a file lock and a half-written build is never visible (tmp folder + rename).

The tokenizer maps each printable ASCII character (and newline) to one token, plus
``<|pad|>``, ``<|bos|>``, ``<|eos|>``, ``<|unk|>``. Encoding adds no special tokens.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import string
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

TINY_PREFIX = "tiny:"
# Bump when a spec or the tokenizer changes so old caches are not reused.
BUILD_VERSION = 1
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>")
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = SPECIAL_TOKENS


@attrs.frozen(kw_only=True)
class TinyModelSpec:
    """Architecture of one tiny model; vocab_size None means 'the tokenizer's size'."""

    model_type: str  # "qwen2" | "llama"
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int | None = None
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    seed: int = 1234
    rope_theta: float | None = None  # None: the architecture's default
    # Saved in this dtype. bfloat16 models are built on a GPU when there is one (an 8B model
    # initialises in seconds there, minutes on CPU), in a process of their own.
    dtype: str = "float32"


def _shape(
    model_type: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, **more: Any
) -> TinyModelSpec:
    """One row of ``TINY_SPECS``: the architecture and its shape, then what differs."""
    return TinyModelSpec(
        model_type=model_type, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=ffn, **more,
    )  # fmt: skip


# fmt: off
TINY_SPECS: dict[str, TinyModelSpec] = {
    # name:                type       hidden layers heads kv heads  FFN
    "qwen2":        _shape("qwen2",       64,    2,    4,    2,     128),
    "llama":        _shape("llama",       64,    2,    4,    2,     128),
    # For GPU benchmarks only (random init, ~1.1B params): slow to build on CPU.
    "llama-1b":     _shape("llama",     2048,   16,   16,   16,    5632,
                           vocab_size=32000, max_position_embeddings=4096),
    # Llama-3.1-8B's shape (GQA 32/8 heads, FFN 14336, vocab 128256, rope theta 5e5), random
    # init, saved in bf16 (16 GB): the one-GPU offload and activation-checkpointing sweeps.
    "llama3.1-8b":  _shape("llama",     4096,   32,   32,    8,   14336,
                           vocab_size=128256, max_position_embeddings=8192,
                           rope_theta=500000.0, dtype="bfloat16"),
    # Llama-3.2-3B's shape (tied embeddings, GQA 24/8 heads, FFN 8192; 3.2 B parameters):
    # what sits at one H100's memory boundary as the 8B sits at one H200's.
    "llama3.2-3b":  _shape("llama",     3072,   28,   24,    8,    8192,
                           vocab_size=128256, max_position_embeddings=8192,
                           rope_theta=500000.0, tie_word_embeddings=True, dtype="bfloat16"),
    # The torch engine's other variants: q/k norms + tied embeddings; a Mistral config.
    "qwen3":        _shape("qwen3",       64,    2,    4,    2,     128, tie_word_embeddings=True),
    "mistral":      _shape("mistral",     64,    2,    4,    1,     128),
    # vLLM's CPU attention rejects head_dim 16 (tiny:qwen2's): 2 heads of 32, otherwise the
    # same shape. The vLLM recipes and tests use it.
    "qwen2-vllm":   _shape("qwen2",       64,    2,    2,    1,     128),
}
# fmt: on


def is_tiny_model_name(model_name: str) -> bool:
    return model_name.startswith(TINY_PREFIX)


def tiny_cache_root() -> Path:
    """``$HPCRL_CACHE/models`` if set, else ``~/.cache/hpcrl/models``."""
    cache = os.environ.get("HPCRL_CACHE")
    base = Path(cache) if cache else Path.home() / ".cache" / "hpcrl"
    return base / "models"


def resolve_model_path(model_name: str, cache_dir: str | None = None) -> str:
    """A loadable location for ``policy.model_name``: tiny:* are built on demand, anything
    else (local path or hub name) is returned as given."""
    if is_tiny_model_name(model_name):
        return ensure_tiny_model(model_name, cache_dir=cache_dir)
    return model_name


def ensure_tiny_model(name: str, cache_dir: str | None = None) -> str:
    """Build ``name`` (e.g. ``tiny:qwen2``) into the cache once; return its folder."""
    short = name.removeprefix(TINY_PREFIX)
    if short not in TINY_SPECS:
        choices = ", ".join(TINY_PREFIX + key for key in TINY_SPECS)
        raise ValueError(f"unknown tiny model {name!r}; valid names are: {choices}")
    root = Path(cache_dir) if cache_dir else tiny_cache_root()
    target = root / f"tiny-{short}-v{BUILD_VERSION}"
    if (target / "config.json").exists():
        return str(target)
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".tiny-{short}.lock"):
        if not (target / "config.json").exists():  # another process may have built it
            spec = TINY_SPECS[short]
            if builds_on_gpu(spec):
                _build_in_own_process(spec, target)
            else:
                _build_atomically(spec, target)
    return str(target)


def builds_on_gpu(spec: TinyModelSpec) -> bool:
    """A bf16 model on a machine with CUDA (``nvidia-smi``-free check: torch says)."""
    if spec.dtype == "float32":
        return False
    import torch

    return torch.cuda.is_available()


def _build_in_own_process(spec: TinyModelSpec, target: Path) -> None:
    """Build on the GPU in a spawned process: the CUDA context and the memory of the build
    go with it (the caller may be a job's driver, whose GPU the training workers need)."""
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(
        target=_build_atomically, args=(spec, target, "cuda")
    )
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(
            f"building {target.name} on the GPU failed (exit code {process.exitcode}); the "
            "process's error is above"
        )


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(spec: TinyModelSpec, target: Path, device: str = "cpu") -> None:
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tokenizer = build_char_tokenizer()
        tokenizer.save_pretrained(tmp_dir)
        model = build_random_model(spec, spec.vocab_size or len(tokenizer), device)
        model.save_pretrained(tmp_dir, safe_serialization=True)
        tmp_dir.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        os.rename(tmp_dir, target)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def tokenizer_alphabet() -> list[str]:
    """Printable ASCII without the other whitespace characters, plus newline."""
    printable = [ch for ch in string.printable if ch not in "\t\r\x0b\x0c\n"]
    return [*printable, "\n"]


def build_char_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast``: one token per character (BPE with no merges)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for char in tokenizer_alphabet():
        vocab[char] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        model_input_names=["input_ids", "attention_mask"],
    )


def tiny_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    """The HF config of ``spec`` (special token ids match the character tokenizer)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        spec.model_type,
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        **({"rope_theta": spec.rope_theta} if spec.rope_theta is not None else {}),
        pad_token_id=SPECIAL_TOKENS.index(PAD_TOKEN),
        bos_token_id=SPECIAL_TOKENS.index(BOS_TOKEN),
        eos_token_id=SPECIAL_TOKENS.index(EOS_TOKEN),
    )


def build_random_model(spec: TinyModelSpec, vocab_size: int, device: str = "cpu") -> Any:
    """A seeded random-init causal LM for ``spec`` in ``spec.dtype``, built on ``device``
    (the same seed gives other numbers on a GPU than on the CPU: only fp32 models, built on
    CPU, are identical on every machine)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(spec, vocab_size)
    devices = [torch.cuda.current_device()] if device == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(spec.seed)
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, spec.dtype))
