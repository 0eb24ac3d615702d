"""Where a steady GRPO step's time goes, from the driver's per-step metrics (``grpo_step.py``).

Every figure is a median over the steady steps (step 3 on) of keys the training core writes
to ``metrics.jsonl``: the phases (``time_generate_s``, ``time_logprobs_s``,
``time_train_s``), the engine's parts of generation (refit, prefill, decode), and rank 0's
pass figures (``hpcrl.core.backends.pass_stats``: ``<pass>_micro_batches``,
``<pass>_token_slots``, ``<pass>_real_tokens``, ``time_<pass>_worker_s``, train's
forward/backward and optimizer seconds, ``<pass>_host_syncs`` when counted). What a phase
spends outside the worker's passes (planning, Ray calls, moving the batch, the controller's
own work) is printed as "controller + Ray".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

PASSES = (
    ("logprobs", "policy log-probs"),
    ("reference", "reference log-probs"),
    ("train", "train"),
)


def steady(records: Sequence[dict]) -> list[dict]:
    steps = [r for r in records if r.get("step", 0) >= 1]
    return steps[2:] or steps


def median_of(records: Sequence[dict], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), int | float)]
    return statistics.median(values) if values else None


def weights_bytes(model_name: str, bytes_per_param: int = 2) -> int | None:
    """Bytes of a ``tiny:`` model's weights in bf16 (others: None), from its spec."""
    from hpcrl.core.models.tiny import TINY_PREFIX, TINY_SPECS

    if not model_name.startswith(TINY_PREFIX):
        return None
    spec = TINY_SPECS[model_name.removeprefix(TINY_PREFIX)]
    if spec.vocab_size is None:
        return None
    hidden, layers, ffn = spec.hidden_size, spec.num_hidden_layers, spec.intermediate_size
    head_dim = hidden // spec.num_attention_heads
    kv = spec.num_key_value_heads * head_dim
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden
    embeddings = spec.vocab_size * hidden * (1 if spec.tie_word_embeddings else 2)
    return bytes_per_param * (layers * per_layer + embeddings + hidden)


def decode_bound(records: Sequence[dict], rows: int, weights: int | None, tbps: float) -> dict:
    """Decode tokens/s of the steady steps against reading the weights once per step."""
    decode_s = median_of(records, "time_decode_s")
    length = median_of(records, "response_length_mean")
    if not decode_s or length is None:
        return {}
    rate = rows * length / decode_s
    out: dict[str, Any] = {"decode_tokens_per_s": rate}
    steps = median_of(records, "generation_decode_steps")
    if steps:
        out["decode_ms_per_step"] = 1e3 * decode_s / steps
    if weights:
        bound = rows * tbps * 1e12 / weights
        out |= {"weights_read_bound_tokens_per_s": bound, "fraction_of_bound": rate / bound}
    return out


def breakdown(records: Sequence[dict]) -> dict[str, Any]:
    """Medians of the phase parts and pass figures (a JSON-able dict)."""
    calm = steady(records)
    keys = ["time_step_s", "time_generate_s", "time_refit_s", "time_prefill_s", "time_decode_s",
            "time_sample_s", "time_logprobs_s", "time_train_s"]  # fmt: skip
    for kind, _ in PASSES:
        keys += [f"{kind}_micro_batches", f"{kind}_token_slots", f"{kind}_real_tokens",
                 f"time_{kind}_worker_s", f"{kind}_host_syncs"]  # fmt: skip
    keys += ["time_train_forward_backward_s", "time_train_optimizer_s"]
    return {key: value for key in keys if (value := median_of(calm, key)) is not None}


def print_breakdown(parts: dict[str, Any], bound: dict[str, Any], label: str) -> None:
    get = parts.get
    print(f"\nwhere a steady step goes{f' ({label})' if label else ''}: median over steps 3+")
    generate = get("time_generate_s")
    if generate is not None:
        engine = sum(get(k, 0.0) for k in ("time_refit_s", "time_prefill_s", "time_decode_s"))
        print(f"  generate {generate:.3f} s = refit {get('time_refit_s', 0):.3f} + prefill "
              f"{get('time_prefill_s', 0):.3f} + decode {get('time_decode_s', 0):.3f} + "
              f"rest {generate - engine:.3f} (Ray, detokenize, reward; optimizer moves with vLLM)")  # fmt: skip
    if bound:
        line = f"    decode {bound['decode_tokens_per_s']:,.0f} tok/s"
        if "decode_ms_per_step" in bound:
            line += f", {bound['decode_ms_per_step']:.2f} ms per decode step"
        if "fraction_of_bound" in bound:
            line += (f" = {bound['fraction_of_bound']:.1%} of the weights-read bound "
                     f"({bound['weights_read_bound_tokens_per_s']:,.0f} tok/s)")  # fmt: skip
        print(line)
    for phase in ("logprobs", "train"):
        print_phase(parts, phase)


def print_phase(parts: dict[str, Any], phase: str) -> None:
    get = parts.get
    total = get(f"time_{phase}_s")
    if total is None:
        return
    kinds = [k for k, _ in PASSES if (k in ("logprobs", "reference")) == (phase == "logprobs")]
    worker = sum(get(f"time_{k}_worker_s", 0.0) for k in kinds)
    if not worker:  # a backend that keeps no pass figures (Megatron so far)
        print(f"  {phase} {total:.3f} s (no pass figures from this backend)")
        return
    print(f"  {phase} {total:.3f} s = worker passes {worker:.3f} + controller + Ray "
          f"{total - worker:.3f}")  # fmt: skip
    for kind, name in PASSES:
        if kind not in kinds or get(f"time_{kind}_worker_s") is None:
            continue
        slots, real = get(f"{kind}_token_slots", 0), get(f"{kind}_real_tokens", 0)
        line = (f"    {name}: {get(f'time_{kind}_worker_s'):.3f} s, "
                f"{get(f'{kind}_micro_batches', 0):.0f} micro-batches, {slots:,.0f} token slots "
                f"for {real:,.0f} real tokens ({real / slots if slots else 0:.0%} used)")  # fmt: skip
        if kind == "train":
            line += (f"; forward/backward {get('time_train_forward_backward_s', 0):.3f} s + "
                     f"optimizer {get('time_train_optimizer_s', 0):.3f} s")  # fmt: skip
        if get(f"{kind}_host_syncs") is not None:
            line += f"; {get(f'{kind}_host_syncs'):.0f} host syncs"
        print(line)
