"""One rank of test_sampler's sync_group test: greedy generation in a 2-process gloo group.

argv: rank port prompt stop_token_id result_json. Writes the responses and the number of
model forward calls this rank made.
"""

import json
import os
import sys

import torch.distributed as dist
import transformers

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.torch_sampler import generate, pad_prompts
from hpcrl.core.models.tiny import ensure_tiny_model


def main() -> None:
    rank, port, prompt, stop_id, result_path = sys.argv[1:]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=2
    )
    path = ensure_tiny_model("tiny:qwen2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    cfg = GenerationCfg(temperature=0.0, max_new_tokens=6, stop_token_ids=(int(stop_id),))
    input_ids, attention_mask = pad_prompts([tokenizer(prompt)["input_ids"]], 0)
    out = generate(
        model,
        input_ids,
        attention_mask,
        cfg,
        seed=0,
        eos_token_id=None,
        pad_token_id=0,
        sync_group=dist.group.WORLD,
    )
    mask = out["response_mask"][0].bool()
    responses = [out["input_ids"][0][mask].tolist()]
    with open(result_path, "w") as handle:
        json.dump({"responses": responses, "forward_calls": len(calls)}, handle)
    dist.destroy_process_group()
    # gloo threads can abort the interpreter at exit (pytorch issue 190489): leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
