"""Settings that need Transformer Engine or CUDA fail at setup with what they need."""

from __future__ import annotations

import attrs

from hpcrl.config.recipe import MegatronCfg, MegatronOptimizerCfg
from hpcrl.core.backends.megatron.offload import requirement_problems


def test_te_settings_without_te_name_each_key():
    cfg = MegatronCfg(enabled=True, fine_grained_activation_offloading=True, offload_modules=("core_attn",),
                      cuda_graph_impl="transformer_engine")
    problems = requirement_problems(cfg, te_available=False, cuda_available=True)
    assert len(problems) == 2
    assert problems[0].startswith("policy.megatron_cfg.fine_grained_activation_offloading=true requires Transformer Engine")
    assert "cuda_graph_impl=transformer_engine requires Transformer Engine" in problems[1]
    assert requirement_problems(cfg, te_available=True, cuda_available=True) == []


def test_optimizer_cpu_offload_needs_cuda():
    cfg = MegatronCfg(enabled=True, optimizer=MegatronOptimizerCfg(optimizer_cpu_offload=True,
                                                                   optimizer_offload_fraction=0.5))
    assert requirement_problems(cfg, te_available=False, cuda_available=True) == []
    (problem,) = requirement_problems(cfg, te_available=False, cuda_available=False)
    assert "optimizer_cpu_offload=true requires CUDA" in problem


def test_optimizer_config_passes_offload_fields_through(megatron_cpu):
    from hpcrl.core.backends.megatron.model import optimizer_config

    cfg = MegatronCfg(enabled=True, optimizer=MegatronOptimizerCfg(
        optimizer_cpu_offload=True, optimizer_offload_fraction=0.25, overlap_cpu_optimizer_d2h_h2d=True))
    config = optimizer_config(cfg, "bfloat16")
    assert (config.optimizer_cpu_offload, config.optimizer_offload_fraction,
            config.overlap_cpu_optimizer_d2h_h2d, config.bf16) == (True, 0.25, True, True)
    assert attrs.evolve(cfg).optimizer.optimizer_offload_fraction == 0.25
