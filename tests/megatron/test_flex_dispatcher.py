"""megatron-core's flex token dispatcher (DeepEP / HybridEP kernels) as NeMo RL's MoE recipes
set it (``hpcrl.config.moe_dispatch``): the settings reach a real megatron-bridge provider and
pass megatron-core's own validation; what megatron-core refuses is refused at validate time;
HybridEP's NVLink-domain variables land in the job's environment; packs are padded to
HybridEP's multiple; and a node without DeepEP's kernels (this one) stops the job at its
preflight with the key and the fix. The kernels themselves are CUDA-only: not run here."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config.moe_dispatch import (
    FlexDispatch,
    hybridep_env,
    pack_multiple,
    rule_flex_dispatcher,
)
from hpcrl.config.recipe import Recipe
from hpcrl.core.backends.megatron.provider import apply_megatron_cfg
from hpcrl.core.machine_checks import machine_problems
from hpcrl.plan.planner import plan
from tests.plan.planning_inputs import local_profile
from tests.recipe_builder import megatron_recipe

MEGATRON = "policy.megatron_cfg"


def with_megatron(recipe: Recipe, **fields) -> Recipe:
    cfg = attrs.evolve(recipe.policy.megatron_cfg, **fields)
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, megatron_cfg=cfg))


def moe_provider():
    from megatron.bridge.models import GPTModelProvider

    return GPTModelProvider(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
        vocab_size=128, seq_length=16, num_moe_experts=4, moe_router_topk=2,
        moe_ffn_hidden_size=32,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "backend"),
    [
        ({"moe_enable_deepep": True}, "deepep"),  # NeMo RL's Moonlight / DeepSeek-V3 recipes
        ({"moe_flex_dispatcher_backend": "hybridep", "moe_hybridep_num_sms": 32}, "hybridep"),
    ],
)
def test_the_settings_pass_megatron_cores_own_validation(megatron_cpu, fields, backend):
    recipe = with_megatron(megatron_recipe(), moe_token_dispatcher_type="flex", **fields)
    assert rule_flex_dispatcher(recipe) == []
    provider = moe_provider()
    apply_megatron_cfg(provider, recipe.policy.megatron_cfg, "float32", seq_length=16)
    provider.finalize()  # megatron-core's TransformerConfig.__post_init__ checks
    assert provider.moe_token_dispatcher_type == "flex"
    assert provider.moe_flex_dispatcher_backend == backend
    assert provider.moe_hybridep_num_sms == fields.get("moe_hybridep_num_sms", 16)


def test_what_megatron_core_refuses_is_refused_at_validate(megatron_cpu):
    alltoall = with_megatron(
        megatron_recipe(), moe_enable_deepep=True, moe_token_dispatcher_type="alltoall"
    )
    (problem,) = rule_flex_dispatcher(alltoall)
    assert (problem.path, problem.value) == (f"{MEGATRON}.moe_enable_deepep", True)
    assert problem.fix == (
        f"set {MEGATRON}.moe_token_dispatcher_type=flex, or {MEGATRON}.moe_enable_deepep=false"
    )
    provider = moe_provider()
    apply_megatron_cfg(provider, alltoall.policy.megatron_cfg, "float32", seq_length=16)
    with pytest.raises(ValueError, match="flex token dispatcher"):
        provider.finalize()  # the refusal is megatron-core's own
    both = with_megatron(
        megatron_recipe(), moe_enable_deepep=True, moe_token_dispatcher_type="flex",
        moe_flex_dispatcher_backend="hybridep",
    )  # fmt: skip
    (problem,) = rule_flex_dispatcher(both)
    assert "runs one backend" in problem.message


def test_shared_expert_overlap_needs_the_alltoall_dispatcher(megatron_cpu):
    overlap = with_megatron(
        megatron_recipe(), moe_token_dispatcher_type="flex", moe_shared_expert_overlap=True
    )
    (problem,) = rule_flex_dispatcher(overlap)
    assert (problem.path, problem.value) == (f"{MEGATRON}.moe_shared_expert_overlap", True)
    provider = moe_provider()
    provider.moe_shared_expert_intermediate_size = 32
    apply_megatron_cfg(provider, overlap.policy.megatron_cfg, "float32", seq_length=16)
    with pytest.raises(ValueError, match="moe_shared_expert_overlap only works with alltoall"):
        provider.finalize()  # megatron-core's own refusal
    alltoall = with_megatron(overlap, moe_token_dispatcher_type="alltoall")
    assert rule_flex_dispatcher(alltoall) == []


def test_hybridep_environment_key_then_job_environment_then_default():
    recipe = with_megatron(
        megatron_recipe(), moe_token_dispatcher_type="flex",
        moe_flex_dispatcher_backend="hybridep", expert_model_parallel_size=8,
    )  # fmt: skip
    assert hybridep_env(FlexDispatch.of(recipe), {}) == {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8",
        "USE_MNNVL": "1",
    }
    assert hybridep_env(FlexDispatch.of(recipe), {"USE_MNNVL": "0"}) == {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8"
    }
    keyed = with_megatron(recipe, hybridep_num_ranks_per_nvlink_domain=4, hybridep_use_mnnvl=False)
    assert hybridep_env(FlexDispatch.of(keyed), {"USE_MNNVL": "1"}) == {
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "4",
        "USE_MNNVL": "0",
    }
    deepep = with_megatron(recipe, moe_flex_dispatcher_backend="deepep")
    assert hybridep_env(FlexDispatch.of(deepep), {}) == {}


def test_the_plan_exports_them_and_the_preflight_stops_without_deep_ep(tmp_path):
    recipe = with_megatron(
        megatron_recipe(), moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
    )  # fmt: skip
    small = attrs.evolve(recipe.cluster, num_nodes=1, gpus_per_node=2)
    recipe = attrs.evolve(recipe, cluster=small)
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, train_global_batch_size=8))
    spec = plan(recipe, local_profile(), run_dir=str(tmp_path / "run"), recipe_source="t")
    env = dict(spec.env)
    assert env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "1"
    assert env["USE_MNNVL"] == "0"
    problems = machine_problems(spec)  # this machine: no deep_ep, no CUDA plan
    assert [(p.path, p.value) for p in problems] == [
        (f"{MEGATRON}.moe_flex_dispatcher_backend", "hybridep"),
        (f"{MEGATRON}.moe_flex_dispatcher_backend", "hybridep"),
    ]
    assert "deep_ep.HybridEPBuffer is not importable" in problems[0].message
    assert problems[0].fix.endswith(
        f"set {MEGATRON}.moe_token_dispatcher_type=alltoall (the same tokens and results)"
    )
    gpu_spec = attrs.evolve(spec, device="gpu")
    assert machine_problems(gpu_spec, cuda_available=lambda: True, deep_ep=lambda name: True) == []
    assert [p.message for p in machine_problems(
        gpu_spec, cuda_available=lambda: True, deep_ep=lambda name: name == "Buffer"
    )] == [problems[0].message]  # fmt: skip


def test_hybridep_packs_are_padded_to_its_multiple():
    from hpcrl.core.workers.micro_batches import BatchingSettings, plan_shards

    base = megatron_recipe()
    packing = attrs.evolve(base.policy.sequence_packing, enabled=True, train_mb_tokens=512)
    recipe = attrs.evolve(base, policy=attrs.evolve(base.policy, sequence_packing=packing))
    hybrid = with_megatron(
        recipe, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep"
    )
    assert (pack_multiple(recipe), pack_multiple(hybrid)) == (1, 128)
    lengths = [[37, 50, 101, 3]]
    (specs,) = plan_shards(lengths, 101, BatchingSettings.from_recipe(hybrid, "train"))
    assert specs and all(spec.packed and spec.pack_width % 128 == 0 for spec in specs)
    (plain,) = plan_shards(lengths, 101, BatchingSettings.from_recipe(recipe, "train"))
    assert all(spec.pack_width % 128 for spec in plain)
