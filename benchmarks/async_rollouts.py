"""Benchmark: async GRPO (generation one step ahead) vs sync GRPO, side by side.

Both runs use the same recipe (the CPU demo, grpo-tiny-1n-cpu.yaml, on a tiny Qwen2 whose
head_dim vLLM's CPU attention supports), the same 2-rank Automodel trainer and the same
separate vLLM generation worker; only ``grpo.async_grpo`` differs (async adds the
importance-sampling correction it requires). Reported per run: median step wall time over
the timed steps, the trainer's median wait for its batch, the median generation time, and
the sync/async step-time ratio (> 1: async is faster). The machine may be shared and noisy:
compare the ratio, not absolute times, and rerun before drawing conclusions.

    .venv-vllm/bin/python benchmarks/async_rollouts.py --steps 10 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

RECIPE = REPO_ROOT / "recipes" / "grpo-tiny-1n-cpu.yaml"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    return parser.parse_args()


def overrides(model_path: str, args: argparse.Namespace, asynchronous: bool) -> list[str]:
    total = args.steps + args.warmup
    common = [
        f"policy.model_name={model_path}",
        f"grpo.max_num_steps={total}",
        f"policy.generation.max_new_tokens={args.max_new_tokens}",
        "policy.generation.backend=vllm",
        "policy.generation.vllm_cfg.precision=float32",
        "policy.generation.vllm_cfg.kv_cache_memory_mb=32",
        "policy.generation.colocated.enabled=false",
        "policy.generation.colocated.resources.num_nodes=1",
        "policy.generation.colocated.resources.gpus_per_node=1",
    ]
    if not asynchronous:
        return common
    return [
        *common,
        "grpo.async_grpo.enabled=true",
        "grpo.async_grpo.max_trajectory_age_steps=1",
        "loss_fn.use_importance_sampling_correction=true",
    ]


def run(model_path: str, args: argparse.Namespace, asynchronous: bool) -> list[dict]:
    from hpcrl.config import load_profile, load_recipe
    from hpcrl.core.algorithms.async_grpo import make_async_grpo_step_fn
    from hpcrl.core.algorithms.grpo import make_grpo_step_fn
    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.data.jsonl import EpochSampler, load_jsonl
    from hpcrl.core.data.prompts import load_tokenizer
    from hpcrl.core.environments.build import build_environment
    from hpcrl.core.workers.group import GroupLayout
    from hpcrl.core.workers.ray_policy import RayPolicy
    from hpcrl.core.workers.vllm_policy import wrap_policy
    from hpcrl.plan.planner import plan

    loaded = load_recipe(RECIPE, overrides(model_path, args, asynchronous))
    recipe = loaded.recipe
    # The generation worker's place as the planner decides it: local, 2 training + 1 slot.
    profile = load_profile("local", ["worker_slots_per_node=3"])
    placement = plan(recipe, profile, run_dir=str(Path.cwd()), recipe_source=str(RECIPE)).generation
    rows = load_jsonl(loaded.source_path.parent / recipe.data.train_path, ["prompt", "answer"])
    tokenizer = load_tokenizer(model_path, recipe.policy.tokenizer)
    env = build_environment(recipe.env)
    sampler = EpochSampler(rows, seed=recipe.grpo.seed)
    layout = GroupLayout(num_nodes=1, workers_per_node=2, device="cpu")
    training = RayPolicy(recipe, model_path, layout, worker_class_path(recipe.backend))
    policy = wrap_policy(training, recipe, model_path, "cpu", placement)
    total = args.steps + args.warmup
    try:
        if asynchronous:
            step_fn = make_async_grpo_step_fn(policy, recipe, tokenizer, env, sampler, total)
        else:
            step_fn = make_grpo_step_fn(policy, recipe, tokenizer, env, sampler)
        records = []
        for step in range(1, total + 1):
            records.append(step_fn(step))
            print(
                f"  {'async' if asynchronous else 'sync '} step {step}: "
                f"{records[-1]['time_step_s']:.2f} s",
                flush=True,
            )
        return records[args.warmup :]
    finally:
        policy.shutdown()


def summary(records: list[dict]) -> dict[str, float]:
    wait_key = "time_generate_wait_s" if "time_generate_wait_s" in records[0] else "time_generate_s"
    return {
        "step_s": statistics.median(r["time_step_s"] for r in records),
        "wait_s": statistics.median(r[wait_key] for r in records),
        "generate_s": statistics.median(r["time_generate_s"] for r in records),
        "train_s": statistics.median(r["time_train_s"] + r["time_logprobs_s"] for r in records),
        "reward_last": records[-1]["reward_mean"],
    }


def main() -> None:
    import ray

    from hpcrl.core.models.tiny import build_char_tokenizer, build_random_model
    from tests.vllm.harness import TINY_VLLM_SPEC

    args = parse_args()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["PYTHONPATH"] = str(REPO_ROOT)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = build_char_tokenizer()
        tokenizer.save_pretrained(folder)
        build_random_model(TINY_VLLM_SPEC, len(tokenizer)).save_pretrained(folder)
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
        )
        try:
            results = {
                mode: summary(run(folder, args, mode == "async")) for mode in ("sync", "async")
            }
        finally:
            ray.shutdown()
    print(
        f"\n{args.steps} timed steps each (after {args.warmup} warm-up), "
        f"max_new_tokens={args.max_new_tokens}; medians in seconds"
    )
    print(f"{'':8}{'step':>8}{'waits for batch':>17}{'generation':>12}{'logprobs+train':>16}")
    for mode, s in results.items():
        print(
            f"{mode:8}{s['step_s']:8.2f}{s['wait_s']:17.2f}{s['generate_s']:12.2f}"
            f"{s['train_s']:16.2f}"
        )
    ratio = results["sync"]["step_s"] / results["async"]["step_s"]
    print(f"sync/async step time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
