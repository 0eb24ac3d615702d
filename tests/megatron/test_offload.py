"""Settings that need Transformer Engine or CUDA fail at setup with what they need; optimizer
CPU offload trains exactly like no offload at every fraction (HybridDeviceOptimizer on CPU
through tests/megatron/offload_standin.py)."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config.recipe import MegatronCfg, MegatronOptimizerCfg
from hpcrl.core.machine_checks import machine_problems
from hpcrl.plan.planner import plan
from tests.megatron import harness
from tests.plan.planning_inputs import plain_slurm_profile, pyxis_profile
from tests.recipe_builder import megatron_recipe


def needs_problems(tmp_path, recipe, device, te_available):
    """What the preflight reports for ``recipe`` planned on ``device`` (a pyxis GPU profile
    or a plain Slurm CPU one), on a node that has CUDA and has Transformer Engine or not."""
    profile = pyxis_profile() if device == "gpu" else plain_slurm_profile()
    spec = plan(recipe, profile, run_dir=str(tmp_path), recipe_source="grpo-x")
    assert spec.device == device
    te_found = lambda: te_available  # noqa: E731
    return machine_problems(spec, cuda_available=lambda: True, transformer_engine=te_found)


def test_te_settings_without_te_name_each_key(tmp_path):
    recipe = megatron_recipe(
        num_nodes=1,
        gpus_per_node=2,
        fine_grained_activation_offloading=True,
        offload_modules=("core_attn",),
        cuda_graph_impl="transformer_engine",
    )
    problems = needs_problems(tmp_path, recipe, "gpu", te_available=False)
    assert len(problems) == 2
    lines = [problem.one_line() for problem in problems]
    assert lines[0].startswith("policy.megatron_cfg.fine_grained_activation_offloading = True: ")
    assert lines[1].startswith("policy.megatron_cfg.cuda_graph_impl = 'transformer_engine': ")
    assert all("requires Transformer Engine" in line for line in lines)
    assert needs_problems(tmp_path, recipe, "gpu", te_available=True) == []


def test_optimizer_cpu_offload_needs_cuda(tmp_path):
    recipe = megatron_recipe(
        num_nodes=1,
        gpus_per_node=2,
        optimizer=MegatronOptimizerCfg(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5),
    )
    assert needs_problems(tmp_path, recipe, "gpu", te_available=False) == []
    (problem,) = needs_problems(tmp_path, recipe, "cpu", te_available=False)
    assert problem.path == "policy.megatron_cfg.optimizer.optimizer_cpu_offload"
    assert problem.message.startswith("requires CUDA") and "turn it off" in problem.fix


def test_optimizer_config_passes_offload_fields_through(megatron_cpu):
    from hpcrl.core.backends.megatron.model import optimizer_config

    cfg = MegatronCfg(
        enabled=True,
        optimizer=MegatronOptimizerCfg(
            optimizer_cpu_offload=True,
            optimizer_offload_fraction=0.25,
            overlap_cpu_optimizer_d2h_h2d=True,
        ),
    )
    config = optimizer_config(cfg, "bfloat16")
    assert (
        config.optimizer_cpu_offload,
        config.optimizer_offload_fraction,
        config.overlap_cpu_optimizer_d2h_h2d,
        config.bf16,
    ) == (True, 0.25, True, True)
    assert attrs.evolve(cfg).optimizer.optimizer_offload_fraction == 0.25


def test_precision_aware_optimizer_is_switched_off_only_without_te_and_offload(megatron_cpu):
    """megatron-core refuses use_precision_aware_optimizer without TE's FusedAdam unless the
    HybridDeviceOptimizer (optimizer_cpu_offload) takes it; the shipped 1n1g Megatron recipe
    sets it (found on the H200 machine, which has no TE)."""
    from hpcrl.core.backends.megatron.model import optimizer_config
    from hpcrl.core.backends.megatron.offload import precision_aware_optimizer_on

    def cfg_with(**optimizer_fields):
        fields = {"use_precision_aware_optimizer": True, "use_distributed_optimizer": True}
        return MegatronCfg(
            enabled=True, optimizer=MegatronOptimizerCfg(**{**fields, **optimizer_fields})
        )

    assert precision_aware_optimizer_on(True, optimizer_cpu_offload=False, te_available=True)
    assert not precision_aware_optimizer_on(True, optimizer_cpu_offload=False, te_available=False)
    assert precision_aware_optimizer_on(True, optimizer_cpu_offload=True, te_available=False)
    assert not precision_aware_optimizer_on(False, optimizer_cpu_offload=False, te_available=True)
    # No TE here: megatron-core builds the config instead of raising "requires FusedAdam"
    assert optimizer_config(cfg_with(), "bfloat16").use_precision_aware_optimizer is False


def test_generic_optimizer_move_is_skipped_when_megatron_owns_placement():
    from types import SimpleNamespace

    from hpcrl.core.backends.base import RankInfo
    from hpcrl.core.backends.megatron.worker import MegatronWorker

    moves: list[str] = []
    worker = MegatronWorker()
    worker.rank_info = RankInfo(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=1,
        device="cuda",
    )
    # Records which moves the worker asks megatron's optimizer for.
    worker.optimizer = SimpleNamespace(
        offload_to_cpu=lambda: moves.append("to_cpu"),
        restore_from_cpu=lambda: moves.append("to_gpu"),
    )
    worker.cfg = MegatronCfg(
        enabled=True,
        optimizer=MegatronOptimizerCfg(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5),
    )
    worker.offload_optimizer()
    worker.onload_optimizer()
    assert worker.skips_generic_optimizer_offload and moves == []

    worker.cfg = MegatronCfg(enabled=True)
    worker.offload_optimizer()
    worker.onload_optimizer()
    assert not worker.skips_generic_optimizer_offload and moves == ["to_cpu", "to_gpu"]


OFFLOAD_STEPS = 4
# Exact equality, because that is what happens here: without TE/Apex megatron-core gives both
# sub-optimizers torch's AdamW, and on this CPU the host copies' step and the in-place one run
# the same kernels on the same values in the same order. Measured 2026-12-02 (megatron-core
# 0.16.1, torch 2.13.0+cpu): fractions 0.5 and 1.0 equal fraction 0 to the bit in loss,
# gradient norm and lr at all 4 steps (largest relative difference 0). On a GPU the device's
# and the host's kernels differ and may round differently: benchmarks/megatron_offload.py
# --sweep prints the largest loss difference there (docs/performance.md: not measured yet).


@pytest.mark.slow
def test_offload_fractions_train_like_no_offload(converted):
    """megatron-core's HybridDeviceOptimizer moves the first ``fraction`` of the parameter
    elements to host copies with their own optimizer; the updates must not change: the same
    losses, gradient norms and learning rates at every step, to the bit. The facts show the
    split really happened."""
    hf_path, root = converted
    fractions = [0.0, 0.5, 1.0]
    (runs,) = harness.run_ranks(
        1, harness.offload_fractions_run, hf_path, root, fractions, OFFLOAD_STEPS
    )
    baseline = runs[0.0]
    assert not baseline["hybrid"]
    losses = [step["loss"] for step in baseline["history"]]
    assert losses[-1] < losses[0]  # it trains
    for fraction in fractions[1:]:
        run = runs[fraction]
        worst = max(
            abs(got["loss"] - want["loss"])
            for got, want in zip(run["history"], baseline["history"], strict=True)
        )
        print(
            f"fraction {fraction}: offloaded {run['offloaded_share']:.2f}, max |dloss| {worst:.1e}"
        )
        assert run["hybrid"]
        assert run["offloaded_share"] == pytest.approx(fraction, abs=0.15)
        assert run["cpu_optimizers_with_state"] > 0  # the host copies were stepped
        for got, want in zip(run["history"], baseline["history"], strict=True):
            for key in ("loss", "grad_norm", "lr"):
                assert got[key] == want[key], (fraction, key, got[key], want[key])
