"""SFT and GRPO through the driver on the real Ray worker group with the Megatron backend
(2 CPU workers, megatron-core over gloo; the real worker enters hpcrl's CPU compatibility
layer itself, the plan's device being CPU). Same recipes and thresholds as the Automodel
learning tests in tests/core."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.require import require_module

require_module("ray")

from hpcrl.core.driver import run_training  # noqa: E402
from hpcrl.run.jobspec_file import read_jobspec  # noqa: E402
from tests.core._driver_harness import mean, read_metrics, write_run_dir  # noqa: E402


@pytest.fixture(scope="module")
def megatron_on_cpu(tmp_path_factory):
    # Exported by the worker before it resolves the conversion directory: keeps the
    # conversion out of ~/.cache. One directory for the module: both runs train tiny:qwen2,
    # the first run's job converts it and the second's reuses it, as a second job of a user
    # does (hpcrl.core.backends.megatron.conversion; ~11-20 s a conversion on 2 cores).
    converted = tmp_path_factory.mktemp("converted")
    return [f"policy.megatron_cfg.env_vars.NRL_MEGATRON_CHECKPOINT_DIR={converted}"]


@pytest.mark.slow
def test_sft_loss_falls_on_megatron(ray_cluster, megatron_on_cpu, tmp_path) -> None:
    overrides = [
        *megatron_on_cpu,
        "policy.automodel_cfg.enabled=false",
        "policy.megatron_cfg.enabled=true",
        "policy.megatron_cfg.apply_rope_fusion=false",
        "policy.megatron_cfg.bias_activation_fusion=false",
        "policy.megatron_cfg.optimizer.lr=3.0e-3",
        "policy.megatron_cfg.optimizer.min_lr=3.0e-3",
        "policy.megatron_cfg.optimizer.bf16=false",
        "policy.megatron_cfg.scheduler.lr_warmup_iters=0",
        "policy.megatron_cfg.scheduler.lr_warmup_init=3.0e-3",
        *SAVE_CONSOLIDATED_AT_THE_END,
    ]
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml", overrides)
    assert run_training(str(run_dir)) == 0
    metrics = [m for m in read_metrics(run_dir) if m["step"] > 0]
    assert [m["step"] for m in metrics] == list(range(1, 21))
    losses = [m["loss"] for m in metrics]
    assert mean(losses[-5:]) < 0.6 * mean(losses[:5]), losses
    assert_job_export_equals_hpcrl_export(run_dir, tmp_path / "exported")


#: The last step's checkpoint, and with it its Hugging Face folder <checkpoint>/hf.
SAVE_CONSOLIDATED_AT_THE_END = (
    "checkpointing.enabled=true", "checkpointing.save_period=20",
    "checkpointing.save_consolidated=true",
)  # fmt: skip


def assert_job_export_equals_hpcrl_export(run_dir: Path, out: Path) -> None:
    """The job's export (2 data-parallel ranks, through megatron-bridge) and ``hpcrl export``'s
    (one process, the torch_dist checkpoint resharded to TP=1) hold the same tensors; both are
    the trained weights, not the initial ones."""
    import torch
    from safetensors.torch import load_file

    from hpcrl.cli.main import main as hpcrl_main
    from hpcrl.core.models.tiny import resolve_model_path

    def tensors(folder: Path) -> dict:
        return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}

    by_job = run_dir / "checkpoints" / "step_000020" / "hf"
    assert hpcrl_main(["export", str(run_dir), "-o", str(out)]) == 0
    exported, written = tensors(out), tensors(by_job)
    assert sorted(exported) == sorted(written) and len(written) > 10
    for name, tensor in written.items():
        assert torch.equal(exported[name], tensor), name
    initial = tensors(Path(resolve_model_path("tiny:qwen2")))
    assert max((written[k] - initial[k]).abs().max().item() for k in initial) > 1e-2


#: NeMo RL's non-colocated Megatron generation (its ...-megatron_generation-noncolocated
#: recipes) on one node of 3 worker slots: cluster.* is the whole job, 1 slot generates.
SEPARATE_MEGATRON_GENERATION = (
    "policy.generation.backend=megatron",
    "policy.generation.colocated.enabled=false",
    "policy.generation.colocated.resources.num_nodes=1",
    "policy.generation.colocated.resources.gpus_per_node=1",
    "cluster.gpus_per_node=3",
)


@pytest.mark.slow
def test_grpo_learns_on_megatron(ray_cluster, megatron_on_cpu, tmp_path) -> None:
    """With NeMo RL's ``policy.generation.backend: megatron``, not colocated: rollouts sampled
    by hpcrl's torch sampler in a generation worker of its own, refitted from the Megatron
    policy's current weights before every generation (the engine starts with none). The
    colocated form is the recipe's own path (backend torch: ``engine_spec`` maps both to the
    sampler fed by the Megatron refit inside the training ranks), run by every
    grpo-tiny-1n-cpu-megatron job of tests/submit; its samples' log-probs are
    test_generate.py's."""
    overrides = [
        *megatron_on_cpu,
        *SEPARATE_MEGATRON_GENERATION,
        "grpo.max_num_steps=12",
        "policy.megatron_cfg.optimizer.lr=1.0e-2",
        "policy.megatron_cfg.optimizer.min_lr=1.0e-2",
        "policy.megatron_cfg.scheduler.lr_warmup_init=1.0e-2",
    ]
    run_dir = write_run_dir(
        tmp_path / "run", "grpo-tiny-1n-cpu-megatron.yaml", overrides,
        profile_overrides=("worker_slots_per_node=3",),
    )  # fmt: skip
    jobspec = read_jobspec(run_dir)
    assert jobspec.world_size == 2  # the recipe's 2 training ranks; the third slot samples
    assert jobspec.generation is not None
    assert (jobspec.generation.backend, jobspec.generation.num_engines) == ("megatron", 1)
    assert run_training(str(run_dir)) == 0
    metrics = [m for m in read_metrics(run_dir) if m["step"] > 0]
    assert [m["step"] for m in metrics] == list(range(1, 13))
    rewards = [m["reward_mean"] for m in metrics]
    # measured 2026-12-04: first-3 mean 0.12 -> last-3 0.83 (an engine left on the first
    # step's weights: flat near 0.1)
    assert mean(rewards[-3:]) >= mean(rewards[:3]) + 0.3, rewards
    # the loss's extrema combine with min/max over micro-batches and data-parallel ranks (on
    # policy: 1; a sum would read the number of micro-batches times ranks)
    for m in metrics:
        assert m["probs_ratio_min"] == pytest.approx(1.0, abs=1e-4)
        assert m["probs_ratio_max"] == pytest.approx(1.0, abs=1e-4)
        # the engine's log-probs of its samples are the trainer's at every step: it sampled
        # with that step's weights (measured within 2e-7 of 1; an engine left on the first
        # step's weights read 1.26 at step 2 and 18 at step 12)
        assert m["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)
