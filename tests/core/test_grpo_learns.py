"""GRPO through the driver on the real Ray worker group (2 CPU workers, FSDP2 over gloo)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.require import require_module

require_module("ray")

from hpcrl.config.checkpoint_metrics import RECORDED  # noqa: E402
from hpcrl.core.driver import run_training  # noqa: E402
from hpcrl.run.checkpoints import complete_checkpoints  # noqa: E402
from tests.core._driver_harness import (  # noqa: E402
    REPO_ROOT,
    mean,
    read_metrics,
    write_local_plan,
    write_run_dir,
)

RECIPE = "grpo-tiny-1n-cpu.yaml"


@pytest.mark.slow
def test_grpo_with_kl_penalty_and_leave_one_out_learns_and_keeps_the_top_k_checkpoints(
    ray_cluster, tmp_path
) -> None:
    """Also the real run of tests/core/test_checkpoint_keep.py (issue 26: it was a run of its
    own, test_checkpoint_keep_run.py, one more start-up of the same workers): validation and
    a checkpoint every 2 steps, keep_top_k 2 by val:accuracy with higher_is_better false (NeMo
    RL's GRPO default metric, which hpcrl once looked up under a key nothing recorded, and so
    kept the newest): the greedy answers get more accurate as the model learns, so the two
    least accurate are early checkpoints, not the newest two; a resumed run starts from the
    newest all the same."""
    run_dir = write_run_dir(
        tmp_path / "run",
        RECIPE,
        [
            "grpo.max_num_steps=12",
            "grpo.use_leave_one_out_baseline=true",
            "loss_fn.reference_policy_kl_penalty=0.01",
            "policy.optimizer.kwargs.lr=1.0e-2",
            f"data.val_path={REPO_ROOT / 'recipes' / 'data' / 'toy_count.jsonl'}",
            "grpo.val_period=2",
            "grpo.val_at_start=true",
            "grpo.max_val_samples=64",
            # greedy validation (NeMo RL samples it at the training temperature by default):
            # the same answers every time, so the accuracy below moves only with the weights
            "policy.generation.val_temperature=0.0",
            "checkpointing.enabled=true",
            "checkpointing.save_period=2",
            "checkpointing.keep_top_k=2",
            "checkpointing.metric_name=val:accuracy",
            "checkpointing.higher_is_better=false",
        ],
    )
    assert run_training(str(run_dir)) == 0
    records = read_metrics(run_dir)
    validations = {m["step"]: m["val_reward_mean"] for m in records if "val_reward_mean" in m}
    assert sorted(validations) == [0, 2, 4, 6, 8, 10, 12]
    assert validations[12] >= validations[0] + 0.3, validations  # greedy answers improve too
    assert_kept_the_top_k_then_resumes_from_the_newest(run_dir, records, validations)
    metrics = [m for m in records if m["step"] > 0]
    assert [m["step"] for m in metrics] == list(range(1, 13))
    rewards = [m["reward_mean"] for m in metrics]
    # margin: the tiny model starts near 0.1 (a random char is a digit ~1/10 of the time)
    assert mean(rewards[-3:]) >= mean(rewards[:3]) + 0.3, rewards
    # the policy equals the reference at step 1; it drifts away as it learns
    assert metrics[0]["kl"] < 1e-4
    assert max(m["kl"] for m in metrics[1:]) > 1e-3
    # NeMo RL's loss metrics, combined over 2 ranks × 4 micro-batches: one optimizer step per
    # GRPO step, so every ratio is 1 (a summed extremum would read 8); the torch engine's
    # log-probs are the trainer's to float precision (token_mult_prob_error = mean e^|Δ| ≈ 1)
    for m in metrics:
        for key in ("probs_ratio", "probs_ratio_min", "probs_ratio_max", "probs_ratio_clamped"):
            assert m[key] == pytest.approx(1.0, abs=1e-4), (key, m[key])
        assert m["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-4)
        assert m["max_seq_mult_prob_error"] == pytest.approx(1.0, abs=1e-4)
        assert 0 < m["approx_entropy"] < 6.0  # about log(vocabulary 100) = 4.6 at the start
        assert m["num_masked_seqs_by_logprob_error"] == 0 and m["overlong_prompts"] == 0
    # rank 0's pass figures (32 rollouts over 2 ranks: 16 rows, train micro-batches of 4,
    # log-prob micro-batches of 8, each cut to its own last real column)
    for m in metrics:
        assert m["train_passes"] == m["logprobs_passes"] == m["reference_passes"] == 1
        assert m["train_micro_batches"] == 4
        assert m["logprobs_micro_batches"] == m["reference_micro_batches"] == 2
        for kind in ("train", "logprobs", "reference"):
            assert 0 < m[f"{kind}_real_tokens"] <= m[f"{kind}_token_slots"]
            assert m[f"{kind}_real_tokens"] < m["num_tokens"]  # rank 0 holds half the rows
            assert m[f"time_{kind}_worker_s"] > 0
        assert m["logprobs_real_tokens"] == m["train_real_tokens"]
        assert m["time_train_worker_s"] <= m["time_train_s"]
        assert_generation_figures(m, rollouts=32)


def assert_kept_the_top_k_then_resumes_from_the_newest(
    run_dir: Path, records: list[dict], validations: dict[int, float]
) -> None:
    accuracy = {step: value for step, value in validations.items() if step > 0}  # saved steps
    # Every NeMo RL metric name hpcrl accepts for GRPO is in the records it writes (step 0's
    # record holds the validation before step 1 alone).
    trained = [m for m in records if m["step"] > 0]
    for (algorithm, prefix), names in RECORDED.items():
        if algorithm == "grpo":
            steps = [m for m in trained if m["step"] in accuracy] if prefix == "val" else trained
            assert all(set(names.values()) <= set(m) for m in steps), (prefix, names)
    # NeMo RL's order: lower is better here, ties go to the newer checkpoint.
    best_two = sorted(accuracy, key=lambda step: (-accuracy[step], step), reverse=True)[:2]
    kept = [step for step, _ in complete_checkpoints(run_dir / "checkpoints")]
    assert kept == sorted({*best_two, 12}), accuracy  # the top 2 by the metric, and the newest
    assert sorted(best_two) != [10, 12], accuracy  # not what keeping the newest would keep

    # A resumed run continues from the newest checkpoint, whatever its metric.
    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    resolved["grpo"]["max_num_steps"] = 14
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    write_local_plan(run_dir)  # the job trains the planned recipe (jobspec.json)
    assert run_training(str(run_dir)) == 0
    assert [m["step"] for m in read_metrics(run_dir)] == [0, *range(1, 15)]


def assert_generation_figures(m: dict, rollouts: int) -> None:
    """The generate phase's own figures (the torch engine on each rank; a time is the slower
    rank's): present, finite, positive, inside the phase, and the rate is tokens / time."""
    for key in ("time_refit_s", "time_sample_s", "time_prefill_s", "time_decode_s",
                "generated_tokens_per_s", "generation_decode_steps"):  # fmt: skip
        assert isinstance(m.get(key), float) and math.isfinite(m[key]) and m[key] > 0, (key, m)
    assert m["time_prefill_s"] <= m["time_sample_s"] and m["time_decode_s"] <= m["time_sample_s"]
    assert m["time_refit_s"] <= m["time_generate_s"] and m["time_sample_s"] <= m["time_generate_s"]
    generated = m["response_length_mean"] * rollouts
    assert m["generated_tokens_per_s"] * m["time_generate_s"] == pytest.approx(generated)


@pytest.mark.slow
def test_preempted_run_resumes_where_it_stopped_with_the_same_results(
    ray_cluster,
    tmp_path,
) -> None:
    overrides = [
        "grpo.max_num_steps=4",
        "checkpointing.enabled=true",
        "checkpointing.save_period=100",
    ]
    straight = write_run_dir(tmp_path / "straight", RECIPE, overrides)
    assert run_training(str(straight)) == 0

    interrupted = write_run_dir(tmp_path / "interrupted", RECIPE, overrides)
    (interrupted / "PREEMPT").touch()
    assert run_training(str(interrupted)) == 3
    assert [m["step"] for m in read_metrics(interrupted)] == [1]
    assert (interrupted / "checkpoints" / "step_000001").is_dir()
    (interrupted / "PREEMPT").unlink()
    assert run_training(str(interrupted)) == 0

    resumed, expected = read_metrics(interrupted), read_metrics(straight)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for got, want in zip(resumed, expected, strict=True):
        assert got["sample_response"] == want["sample_response"]
        assert got["reward_mean"] == pytest.approx(want["reward_mean"], abs=1e-6)
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
    # the last step saved a checkpoint (save at the end of the run)
    assert (interrupted / "checkpoints" / "step_000004").is_dir()
