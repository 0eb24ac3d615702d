"""Benchmark: what sequence packing and dynamic batching buy on GRPO-shaped batches.

One global batch of rollouts with GRPO's length mix (prompts 40–200 tokens, responses
long-tailed up to the generation limit, so most rows are short and a few hit the limit),
trained four ways in one process, same model, same weights, same loss, through hpcrl's own
micro-batching (``hpcrl.core.workers.micro_batches``) and the Automodel forward
(``TokenLogprobModel`` + ``forward_logprobs``):

- ``fixed-global``: hpcrl's default — ``train_micro_batch_size`` rows padded to the batch's
  longest row;
- ``fixed-trimmed``: the plain thing a user would write — the same micro-batches, each cut
  to its own longest row (the baseline the ratios are against);
- ``dynamic``: NeMo RL's dynamic batching (rows sorted by length, grouped within the token
  budget, widths rounded to 64);
- ``packed``: NeMo RL's sequence packing (modified first-fit decreasing into packs of the
  token budget; attention restarts at each sequence).

Each way runs forward + backward over every micro-batch and one AdamW step; reported: real
(non-padding) tokens/s, token slots computed, the ratio to ``fixed-trimmed``, and the losses
(which agree: same batch, same weights). A packed forward on SDPA uses a block-diagonal
mask over the pack (transformers builds it from the positions): no FlashAttention varlen
kernel is needed, but attention still computes the masked-out blocks.

    python benchmarks/packing.py --device cpu --tiny              # smoke check (CPU, ~1 min)
    python benchmarks/packing.py --device cuda --rows 256 --max-len 4096 --mb-tokens 16384
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

WAYS = ("fixed-global", "fixed-trimmed", "dynamic", "packed")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny Llama instead of ~1.1B")
    parser.add_argument("--rows", type=int, default=256, help="rollouts in the global batch")
    parser.add_argument(
        "--max-len", type=int, default=4096, help="policy.max_total_sequence_length"
    )
    parser.add_argument("--micro-batch", type=int, default=4, help="train_micro_batch_size")
    parser.add_argument(
        "--mb-tokens", type=int, default=None, help="default: max-len x micro-batch"
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps per way")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def grpo_lengths(rows: int, max_len: int, seed: int) -> list[int]:
    """Prompt 40–200 tokens (scaled down for short limits) + a long-tailed response: mean
    about a quarter of the room, ~5% cut off at the limit."""
    rng = random.Random(seed)
    prompt_max = min(200, max_len // 4)
    lengths = []
    for _ in range(rows):
        prompt = rng.randint(min(40, prompt_max), prompt_max)
        room = max_len - prompt
        lengths.append(prompt + min(room, 1 + int(rng.expovariate(4.0 / room))))
    return lengths


def make_batch(lengths: list[int], max_len: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows = len(lengths)
    input_ids = torch.randint(0, vocab, (rows, max_len), generator=generator)
    attention_mask = torch.zeros(rows, max_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        attention_mask[row, :length] = 1
    token_mask = attention_mask.float()
    token_mask[:, 0] = 0
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask,
            "token_mask": token_mask}  # fmt: skip


def settings_for(way: str, args: argparse.Namespace):
    from hpcrl.core.workers.micro_batches import BatchingSettings

    budget = args.mb_tokens or args.max_len * args.micro_batch
    if way in ("fixed-global", "fixed-trimmed"):
        return BatchingSettings(rows_per_micro_batch=args.micro_batch)
    return BatchingSettings(mode=way, tokens_per_micro_batch=budget, round_to=64)


def plan_for(way: str, batch: dict, args: argparse.Namespace):
    from hpcrl.core.workers.micro_batches import MicroBatchSpec, plan_shards, row_lengths

    lengths = row_lengths(batch)
    plan = plan_shards([lengths], args.max_len, settings_for(way, args))[0]
    if way == "fixed-trimmed":
        plan = [MicroBatchSpec(rows=s.rows, width=max(lengths[r] for r in s.rows)) for s in plan]
    return plan


def build_model(args: argparse.Namespace, folder: str):
    from hpcrl.core.backends.automodel.model import TokenLogprobModel, load_hf_model
    from hpcrl.core.models.tiny import TINY_SPECS, build_random_model

    spec = TINY_SPECS["llama" if args.tiny else "llama-1b"]
    build_random_model(spec, vocab_size=spec.vocab_size or 256).save_pretrained(folder)
    root = TokenLogprobModel(load_hf_model(folder, args.device))
    if args.device == "cuda":
        root.autocast_dtype = torch.bfloat16
    return root, spec.vocab_size or 256


def train_step(root, optimizer, batch, plan, device: str) -> float:
    from hpcrl.core.algorithms.losses import sft_loss
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs
    from hpcrl.core.workers.micro_batches import materialize

    num_tokens = float(batch["token_mask"].sum())
    total = 0.0
    for spec in plan:
        micro = {k: v.to(device) for k, v in materialize(batch, spec).items()}
        loss, _ = sft_loss(forward_logprobs(root, micro)[0], micro, num_tokens)
        loss.backward()
        total += float(loss.detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def run_way(way, root, batch, args) -> dict[str, float]:
    plan = plan_for(way, batch, args)
    state = {k: v.detach().clone() for k, v in root.state_dict().items()}
    optimizer = torch.optim.AdamW(root.parameters(), lr=1e-6)
    step = functools.partial(train_step, root, optimizer, batch, plan, args.device)
    first_loss = step()
    for _ in range(args.warmup - 1):
        step()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = (time.perf_counter() - started) / args.steps
    root.load_state_dict(state)  # every way starts from the same weights
    real = float(batch["attention_mask"].sum())
    return {"tokens_per_s": real / seconds, "slots": float(sum(s.tokens for s in plan)),
            "micro_batches": float(len(plan)), "step_s": seconds, "first_loss": first_loss}  # fmt: skip


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as folder:
        root, vocab = build_model(args, folder)
        lengths = grpo_lengths(args.rows, args.max_len, args.seed)
        batch = make_batch(lengths, args.max_len, vocab, args.seed)
        real = sum(lengths)
        print(f"{args.rows} rollouts, max {args.max_len}, {real} real tokens "
              f"({real / (args.rows * args.max_len):.0%} of the padded batch); device {args.device}", flush=True)  # fmt: skip
        results = {}
        for way in WAYS:
            results[way] = run_way(way, root, batch, args)
            print(f"  {way}: {results[way]['step_s']:.3f} s/step", flush=True)
    base = results["fixed-trimmed"]["tokens_per_s"]
    print(f"{'way':<14}{'real tok/s':>12}{'x trimmed':>11}{'slots':>10}{'micro':>7}{'step s':>9}"
          f"{'loss':>10}")  # fmt: skip
    for way, r in results.items():
        print(f"{way:<14}{r['tokens_per_s']:>12.0f}{r['tokens_per_s'] / base:>11.2f}"
              f"{r['slots']:>10.0f}{r['micro_batches']:>7.0f}{r['step_s']:>9.3f}{r['first_loss']:>10.5f}")  # fmt: skip


if __name__ == "__main__":
    main()
