"""Benchmark: GRPO steps of the one-GPU recipe through the real driver, phase by phase.

``recipes/grpo-llama-1b-1n1g-automodel.yaml`` (the ~1.1B Llama-shaped model, 64 rollouts ×
128 new tokens per step, Automodel backend, hpcrl's torch engine) runs through
``hpcrl.core.driver.run_training`` exactly as a job does (a local Ray, one GPU worker).
Printed per step from its ``metrics.jsonl``: generate (with its refit, prefill and decode
parts), log-probs, train and step seconds, generated tokens/s, torch.compile's graph count
and the engine's new CUDA graph captures. Then the steady state (median step from step 3 on)
against issue 12's goals: median step ≤ 1.2 s, and no step after the second above 1.5× the
median (a recompilation or capture stall shows there); the decode rate against the bound of
reading the bf16 weights once per decode step (``--bandwidth-tbps``, the H200's measured
copy bandwidth by default); and where the steady step's time goes (``breakdown``): the
generate phase's refit / prefill / decode / the rest, and per log-prob and train pass the
worker's seconds (train: forward/backward against optimizer), micro-batches, token slots
computed against real tokens, what the controller and Ray add, and with ``--count-syncs``
the host synchronisations per pass (``hpcrl.core.backends.pass_stats``).

    python benchmarks/grpo_step.py --steps 12 --out-dir /tmp/grpo-bench
    python benchmarks/grpo_step.py --steps 10 --override policy.train_micro_batch_size=4
    python benchmarks/grpo_step.py --steps 8 --stop-tokens 512 --label early-stop
    python benchmarks/grpo_step.py --tiny        # CPU smoke: the demo recipe, 3 steps

The random-init model never samples its EOS on purpose, so every row runs to
``max_new_tokens`` and the engine's early-finish path (compaction into smaller row buckets,
whose CUDA graphs are captured when first met) never runs. ``--stop-tokens N`` makes N token
ids, spread evenly over the vocabulary, stop tokens (``policy.generation.stop_token_ids``):
with a near-uniform random model each sampled token ends its row with probability ≈ N /
vocab, so rows finish at varied lengths (512 of 32,000: ≈ 1.6% per token, median response
≈ 43 tokens, ≈ 13% of rows to 128). Then the per-step table's ``compact`` and ``captures``
columns show compactions and new row-bucket graphs, ``resp len`` / ``trunc`` the lengths,
and the stall goal is judged on those steps (``EARLY-STOP`` line: was the path exercised).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from benchmarks import grpo_breakdown  # noqa: E402
from hpcrl.core.backends.pass_stats import COUNT_SYNCS_ENV  # noqa: E402

GOAL_STEP_S = 1.2
GOAL_WORST_OVER_MEDIAN = 1.5
H200_COPY_TBPS = 4.15  # device-to-device copy bandwidth measured on the H200 (docs/performance.md)
COLUMNS = (
    ("time_generate_s", "gen"),
    ("time_refit_s", "refit"),
    ("time_prefill_s", "prefill"),
    ("time_decode_s", "decode"),
    ("time_logprobs_s", "logprobs"),
    ("time_train_s", "train"),
    ("time_step_s", "step"),
    ("time_gc_driver_s", "gc driver"),
    ("time_gc_worker_s", "gc worker"),
    ("gpu_segments_allocated_worker", "new segs"),
    ("generated_tokens_per_s", "gen tok/s"),
    ("compiled_graphs", "compiled"),
    ("generation_graph_captures", "captures"),
    ("generation_compactions", "compact"),
    ("response_length_mean", "resp len"),
    ("truncated_fraction", "trunc"),
    ("reward_mean", "reward"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="grpo-llama-1b-1n1g-automodel.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="run folder (default: a temp one)"
    )
    parser.add_argument("--override", action="append", default=[], help="extra key=value")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke: the demo recipe")
    parser.add_argument("--bandwidth-tbps", type=float, default=H200_COPY_TBPS)
    parser.add_argument(
        "--count-syncs", action="store_true", help="count host syncs per pass (CUDA workers)"
    )
    parser.add_argument("--label", default="", help="name printed with the summary (A/B runs)")
    parser.add_argument(
        "--stop-tokens",
        type=int,
        default=0,
        metavar="N",
        help="make N token ids (spread over the vocabulary) stop tokens, so that rows of the "
        "random-init model finish early at varied lengths (compaction, row buckets)",
    )
    parser.add_argument(
        "--cluster", default="local-gpu", help="profile the run is planned on (--tiny: local)"
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.recipe, args.steps, args.cluster = "grpo-tiny-1n-cpu.yaml", 3, "local"
    return args


def write_run_dir(run_dir: Path, recipe: str, overrides: list[str], cluster: str) -> Any:
    """The resolved recipe and the plan (``jobspec.json``, planned on ``cluster`` by the real
    planner), as ``hpcrl submit`` writes them into a run folder; returns the recipe. Without
    a plan the driver would plan on the CPU ``local`` profile."""
    import yaml

    from hpcrl.config import load_profile, load_recipe
    from hpcrl.plan.planner import plan
    from hpcrl.run.jobspec_file import write_jobspec

    run_dir.mkdir(parents=True, exist_ok=True)
    loaded = load_recipe(REPO_ROOT / "recipes" / recipe, overrides)
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(loaded.resolved_dict))
    spec = plan(
        loaded.recipe, load_profile(cluster), run_dir=str(run_dir.absolute()),
        recipe_source=recipe, profile_source=cluster,
    )  # fmt: skip
    write_jobspec(spec)
    print(f"planned on {cluster}: device {spec.device}, {spec.slots_per_node} slot(s)", flush=True)
    return loaded.recipe


def summarize(records: list[dict]) -> dict:
    steps = [r for r in records if r.get("step", 0) >= 1]
    times = [r["time_step_s"] for r in steps]
    steady = times[2:] or times
    median = statistics.median(steady)
    worst_late = max(times[2:], default=median)
    return {
        "steps": len(steps),
        "median_step_s_from_step_3": median,
        "worst_step_after_second_s": worst_late,
        "worst_over_median": worst_late / median,
        "median_generated_tokens_per_s": statistics.median(
            r["generated_tokens_per_s"] for r in steps[2:] or steps
        ),
        "goal_step_s_met": median <= GOAL_STEP_S,
        "goal_no_stall_met": worst_late <= GOAL_WORST_OVER_MEDIAN * median,
    }


def print_steps(records: list[dict]) -> None:
    print("step  " + "  ".join(f"{label:>9s}" for _, label in COLUMNS))
    for record in records:
        if record.get("step", 0) < 1:
            continue
        cells = []
        for key, _ in COLUMNS:
            value = record.get(key)
            cells.append(f"{value:9.3f}" if isinstance(value, float) else f"{value!s:>9s}")
        print(f"{record['step']:4d}  " + "  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    if args.count_syncs:
        os.environ[COUNT_SYNCS_ENV] = "1"  # the Ray workers inherit it
    run_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="hpcrl-grpo-bench-"))
    overrides = [f"grpo.max_num_steps={args.steps}", *args.override]
    if args.stop_tokens:
        overrides.append(stop_tokens_override(args.recipe, args.stop_tokens))
    recipe = write_run_dir(run_dir, args.recipe, overrides, args.cluster)
    from hpcrl.core.driver import run_training

    code = run_training(str(run_dir))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"\n{args.label or args.recipe}: {args.recipe} {' '.join(args.override)}, "
          f"{args.steps} steps, run folder {run_dir}")  # fmt: skip
    print_steps(records)
    summary = summarize(records)
    rows = recipe.grpo.num_prompts_per_step * recipe.grpo.num_generations_per_prompt
    weights = grpo_breakdown.weights_bytes(recipe.policy.model_name)
    bound = grpo_breakdown.decode_bound(
        grpo_breakdown.steady(records), rows, weights, args.bandwidth_tbps
    )
    parts = grpo_breakdown.breakdown(records)
    grpo_breakdown.print_breakdown(parts, bound, args.label)
    summary |= {"label": args.label, "overrides": args.override, "decode": bound,
                "breakdown": parts}  # fmt: skip
    if args.stop_tokens:
        summary["early_stop"] = early_stop_summary(records, args.stop_tokens)
    print(json.dumps(summary, indent=1))
    print_goals(summary, args.label)
    (run_dir / "grpo_step_summary.json").write_text(json.dumps(summary, indent=1))
    return code


def print_goals(summary: dict, label: str) -> None:
    """One line per goal of issue 12 (what the lead reads first)."""
    name = f" [{label}]" if label else ""
    median, worst = summary["median_step_s_from_step_3"], summary["worst_over_median"]
    verdict = {True: "MET", False: "NOT MET"}
    print(f"GOAL{name} steady step <= {GOAL_STEP_S} s: median {median:.3f} s "
          f"{verdict[summary['goal_step_s_met']]}")  # fmt: skip
    print(f"GOAL{name} no step after the second > {GOAL_WORST_OVER_MEDIAN}x median: worst "
          f"{worst:.2f}x {verdict[summary['goal_no_stall_met']]}")  # fmt: skip
    fraction = summary["decode"].get("fraction_of_bound")
    if fraction is not None:
        print(f"BOUND{name} decode at {fraction:.1%} of the weights-read bound")
    early = summary.get("early_stop")
    if early is not None:
        print(f"EARLY-STOP{name} {early['stop_tokens']} stop ids: rows ended by a stop "
              f"{early['stopped_fraction_min']:.0%}-{early['stopped_fraction_max']:.0%} per step, "
              f"mean response {early['response_length_min']:.0f}-"
              f"{early['response_length_max']:.0f} tokens; compactions per step "
              f"{early['compactions_per_step']}; graph captures per step "
              f"{early['captures_per_step']}: early-finish path "
              f"{'EXERCISED' if early['exercised'] else 'NOT EXERCISED'}")  # fmt: skip


def vocab_size(model_name: str) -> int:
    """The vocabulary of a ``tiny:`` model, from its spec (no build)."""
    from hpcrl.core.models.tiny import SPECIAL_TOKENS, TINY_PREFIX, TINY_SPECS, tokenizer_alphabet

    if not model_name.startswith(TINY_PREFIX):
        raise SystemExit(f"--stop-tokens needs a tiny: model (random init), not {model_name}")
    spec = TINY_SPECS[model_name.removeprefix(TINY_PREFIX)]
    return spec.vocab_size or len(SPECIAL_TOKENS) + len(tokenizer_alphabet())


def stop_token_ids(vocab: int, count: int, first: int) -> list[int]:
    """``count`` ids spread evenly over ``[first, vocab)`` (the ids below ``first`` are the
    special tokens)."""
    if not 0 < count <= vocab - first:
        raise SystemExit(f"--stop-tokens {count}: needs 1 to {vocab - first} (vocabulary {vocab})")
    return sorted({first + (index * (vocab - first)) // count for index in range(count)})


def stop_tokens_override(recipe_name: str, count: int) -> str:
    from hpcrl.config import load_recipe
    from hpcrl.core.models.tiny import SPECIAL_TOKENS

    model_name = load_recipe(REPO_ROOT / "recipes" / recipe_name, []).recipe.policy.model_name
    ids = stop_token_ids(vocab_size(model_name), count, len(SPECIAL_TOKENS))
    return f"policy.generation.stop_token_ids=[{','.join(map(str, ids))}]"


def early_stop_summary(records: list[dict], stop_tokens: int) -> dict:
    """Did rows finish early, and did the engine compact them (every step from step 1)?"""
    steps = [r for r in records if r.get("step", 0) >= 1]
    stopped = [1.0 - r.get("truncated_fraction", 1.0) for r in steps]
    lengths = [r.get("response_length_mean", 0.0) for r in steps]
    compactions = [int(r.get("generation_compactions", 0)) for r in steps]
    captures = [int(r.get("generation_graph_captures", 0)) for r in steps]
    return {"stop_tokens": stop_tokens,
            "stopped_fraction_min": min(stopped, default=0.0),
            "stopped_fraction_max": max(stopped, default=0.0),
            "response_length_min": min(lengths, default=0.0),
            "response_length_max": max(lengths, default=0.0),
            "compactions_per_step": compactions, "captures_per_step": captures,
            "exercised": sum(compactions[2:]) > 0}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
