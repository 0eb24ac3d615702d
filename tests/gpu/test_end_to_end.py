"""The user's path on one GPU: ``hpcrl submit``/``sweep`` with ``--cluster local-gpu``, the real
node entrypoint, Ray, the training core and both backends, then ``hpcrl report``.

(a) Automodel + hpcrl's torch sampler, GRPO; (b) Megatron through megatron-bridge, converting
a local HF checkpoint for real; (c) the flagship sweep of the Megatron optimizer's CPU offload
fraction, every point through the real driver, reported as a table and plots. The model is
the Llama-shaped 1.1B of hpcrl/core/models/tiny.py saved as an HF checkpoint.

Order is by what is least proven: Megatron, the sweep (it reuses (b)'s conversion), then
Automodel (which already ran GRPO on the H200 once the GPU count reached submitit); device
time is short and tests/gpu/device_run.sh stops pytest at its limit.
"""

from __future__ import annotations

import re
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

AUTOMODEL_RECIPE = "grpo-llama-1b-1n1g-automodel.yaml"  # shipped recipes, found by name
MEGATRON_RECIPE = "grpo-llama-1b-1n1g-megatron.yaml"
NUM_STEPS = 3
SWEEP_STEPS = 3
OPT = "policy.megatron_cfg.optimizer"
# Fraction 0 is "offload off" (with the switch on a fraction must be in (0, 1]), so the switch
# moves together with the fraction: one --zip axis of two keys.
FRACTIONS = ("0", "0.5", "1.0")
SWEEP_AXIS = [
    "--zip", f"{OPT}.optimizer_cpu_offload=false,true,true",
    "--zip", f"{OPT}.optimizer_offload_fraction={','.join(FRACTIONS)}",
]  # fmt: skip


@pytest.fixture
def env(gpu_cache: Path) -> dict[str, str]:
    return user_env(gpu_cache)


@pytest.fixture
def megatron_dir(gpu_cache: Path) -> Path:
    """Where the Megatron jobs convert: the plan resolves it from the recipe's env_vars (set
    below) and the job converts exactly there, whatever its shell environment says."""
    return gpu_cache / "megatron"


def in_megatron_dir(megatron_dir: Path) -> str:
    return f"policy.megatron_cfg.env_vars.NRL_MEGATRON_CHECKPOINT_DIR={megatron_dir}"


# The commands, as docs/performance.md prints them (tests/gpu/test_documented_commands.py).
def megatron_args(run_dir: Path, model: Path, megatron_dir: Path) -> list[str]:
    # force: a conversion left by an earlier run on the same machine must not stand in for one
    force = "policy.megatron_cfg.force_reconvert_from_hf=true"
    return submit_args(MEGATRON_RECIPE, run_dir, model, force, in_megatron_dir(megatron_dir))


def automodel_args(run_dir: Path, model: Path) -> list[str]:
    return submit_args(AUTOMODEL_RECIPE, run_dir, model)


def submit_args(recipe: str, run_dir: Path, model: Path, *extra: str) -> list[str]:
    return ["submit", recipe, "--cluster", GPU_PROFILE, "-o", str(run_dir), "--wait",
            f"policy.model_name={model}", f"grpo.max_num_steps={NUM_STEPS}", *extra]  # fmt: skip


def sweep_args(sweep_dir: Path, model: Path, megatron_dir: Path) -> list[str]:
    return ["sweep", MEGATRON_RECIPE, "--cluster", GPU_PROFILE, "-o", str(sweep_dir),
            *SWEEP_AXIS, f"policy.model_name={model}", f"grpo.max_num_steps={SWEEP_STEPS}",
            in_megatron_dir(megatron_dir), "--wait"]  # fmt: skip


def report_args(sweep_dir: Path) -> list[str]:
    return ["report", str(sweep_dir)]


def _submit_and_check(args: list[str], run_dir: Path, env: dict, timeout_s: float):
    result = hpcrl(args, run_dir.parent, env, timeout_s=timeout_s)
    assert result.returncode == 0, output_of(result)
    assert job_state(run_dir, run_dir.parent, env) == "COMPLETED"
    records = check_step_metrics(run_dir, NUM_STEPS)
    assert_nothing_left(run_dir)
    return records


def test_megatron_grpo_converts_the_hf_checkpoint(
    gpu_out: Path, hf_checkpoint: Path, env: dict, megatron_dir: Path
) -> None:
    run_dir = gpu_out / "megatron"
    _submit_and_check(megatron_args(run_dir, hf_checkpoint, megatron_dir), run_dir, env, 540)
    driver_log = "\n".join(p.read_text() for p in run_dir.glob("logs/node0/attempt*/driver.log"))
    assert "conversion written" in driver_log, "megatron-bridge converted in this job"
    done = re.search(r"\[hpcrl megatron conversion\] done in [0-9.]+ s: (\S+)", driver_log)
    assert done, "the conversion reported where it wrote"
    assert (Path(done.group(1)) / "hpcrl_conversion_complete.json").is_file()
    # The planned directory (JobSpec.megatron_checkpoint_dir) reached the GPU worker.
    assert Path(done.group(1)).parent == megatron_dir, done.group(1)


def test_offload_sweep_then_report(
    gpu_out: Path, hf_checkpoint: Path, env: dict, megatron_dir: Path, failed_gpu_tests: set
) -> None:
    if "test_megatron_grpo_converts_the_hf_checkpoint" in failed_gpu_tests:
        pytest.fail("the single Megatron job failed above; every sweep point would fail alike")
    sweep_dir = gpu_out / "offload-sweep"
    result = hpcrl(sweep_args(sweep_dir, hf_checkpoint, megatron_dir), gpu_out, env, timeout_s=900)
    assert result.returncode == 0, output_of(result)
    points = [sweep_dir / f"point-{index}" for index in range(len(FRACTIONS))]
    for point in points:
        assert job_state(point, gpu_out, env) == "COMPLETED"
        check_step_metrics(point, SWEEP_STEPS)
        assert_nothing_left(point)

    report = hpcrl(report_args(sweep_dir), gpu_out, env, timeout_s=300)
    assert report.returncode == 0, output_of(report)
    _check_report_table(report.stdout, points)
    _check_report_plots(report.stdout, sweep_dir / "report")
    _check_offload_moves_memory(sweep_dir)


def test_automodel_grpo_on_one_gpu(gpu_out: Path, hf_checkpoint: Path, env: dict) -> None:
    run_dir = gpu_out / "automodel"
    _submit_and_check(automodel_args(run_dir, hf_checkpoint), run_dir, env, 420)


def _check_report_table(table: str, points: list[Path]) -> None:
    header = next(line for line in table.splitlines() if "median step s" in line)
    for column in ("optimizer_offload_fraction", "peak GPU GB", "peak RSS GB"):
        assert column in header, header
    for point, fraction in zip(points, FRACTIONS, strict=True):
        row = next(line for line in table.splitlines() if f" {point.name} " in f" {line} ")
        assert f" {fraction} " in row and "—" not in row, f"incomplete row: {row}"


def _check_report_plots(report_out: str, plot_dir: Path) -> None:
    plotted = [line.strip() for line in report_out.splitlines() if line.startswith("plot: ")]
    for name in ("step_time.png", "vs_optimizer_offload_fraction.png"):
        path = plot_dir / name
        assert any(line.endswith(f"report/{name}") for line in plotted), report_out
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"


def _check_offload_moves_memory(sweep_dir: Path) -> None:
    """Peak GPU memory falls as more optimizer state moves to the CPU."""
    from hpcrl.report.summary import build_report

    rows = build_report(sweep_dir).rows
    by_fraction = {float(r.swept_values[f"{OPT}.optimizer_offload_fraction"]): r for r in rows}
    peaks = [by_fraction[float(f)].summary.peak_gpu_mem_gb for f in FRACTIONS]
    print(f"peak GPU GB by fraction {FRACTIONS}: {peaks}", flush=True)
    assert peaks[0] > peaks[1] > peaks[2], (
        f"peak GPU memory does not fall with the fraction: {peaks}"
    )
