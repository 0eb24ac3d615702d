"""``policy.automodel_cfg.reference_on_host`` on a GPU, through the user's path: a sweep of the
shipped 1.1B Automodel GRPO recipe over the switch (``hpcrl sweep ... --cluster local-gpu``).
What only a GPU shows: the reference's fp32 weights leave the GPU (the peak falls by most of
their 4.4 GB; its shards sit in page-locked host memory and come in one block at a time), and
the blocks copied in compute the policy's own log-probs (step 1's KL, policy against
reference before any update, stays ~0: uninitialised or misplaced weights would not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu.harness import (
    GPU_PROFILE,
    assert_nothing_left,
    check_step_metrics,
    hpcrl,
    job_state,
    output_of,
    user_env,
)

pytestmark = pytest.mark.gpu

RECIPE = "grpo-llama-1b-1n1g-automodel.yaml"
STEPS = 2
KEY = "policy.automodel_cfg.reference_on_host"
# fp32 weights of the 1.1B: 4.4 GB; less the largest block gathered at a time and slack
MIN_FREED_GB = 3.0


def sweep_args(sweep_dir: Path, model: Path) -> list[str]:
    return ["sweep", RECIPE, "--cluster", GPU_PROFILE, "-o", str(sweep_dir),
            "--grid", f"{KEY}=false,true", f"policy.model_name={model}",
            f"grpo.max_num_steps={STEPS}", "--wait"]  # fmt: skip


def test_host_reference_frees_its_weights_and_keeps_the_logprobs(
    gpu_out: Path, hf_checkpoint: Path, gpu_cache: Path
) -> None:
    env = user_env(gpu_cache)
    sweep_dir = gpu_out / "host-reference-sweep"
    result = hpcrl(sweep_args(sweep_dir, hf_checkpoint), gpu_out, env, timeout_s=600)
    assert result.returncode == 0, output_of(result)
    records = {}
    for index, on_host in enumerate((False, True)):
        point = sweep_dir / f"point-{index}"
        assert job_state(point, gpu_out, env) == "COMPLETED"
        records[on_host] = check_step_metrics(point, STEPS)
        assert_nothing_left(point)
    peaks = {on_host: max(r["peak_gpu_mem_gb"] for r in rs) for on_host, rs in records.items()}
    kl_step1 = {on_host: rs[0]["kl"] for on_host, rs in records.items()}
    print(f"peak GPU GB {peaks}, step 1 KL {kl_step1}", flush=True)
    assert peaks[False] - peaks[True] >= MIN_FREED_GB, peaks
    for on_host, kl in kl_step1.items():
        assert 0 <= kl < 1e-3, f"reference_on_host={on_host}: step 1 KL {kl}"
