"""Bounds declared beside their fields (``bounded`` in the schema): one walk reports every
value outside its range, with the full key path, the value and the fix, never stopping at
the first."""

import attrs

from hpcrl.config import structure_profile
from hpcrl.config.field_bounds import FieldBound, at_least, bounded, check_field_bounds
from hpcrl.config.profile_rules import check_profile
from tests.recipe_builder import problems_for


def shown(problems):
    return {problem.path: (problem.value, problem.message, problem.fix) for problem in problems}


def test_bad_fields_of_every_section_are_reported_together_with_path_value_and_fix():
    problems = shown(
        problems_for(
            policy__generation__top_p=0.0,
            policy__megatron_cfg__optimizer__adam_beta1=1.0,
            loss_fn__ratio_clip_c=0.5,
            checkpointing__save_period=0,
            cluster__num_nodes=0,
            grpo__seed=-1,
        )
    )
    assert problems["policy.generation.top_p"] == (
        0.0, "must be in (0, 1]", "set policy.generation.top_p=1.0 to turn it off",
    )  # fmt: skip
    assert problems["policy.megatron_cfg.optimizer.adam_beta1"] == (
        1.0, "must be in [0, 1)", "e.g. 0.9 and 0.999",
    )  # fmt: skip
    assert problems["loss_fn.ratio_clip_c"] == (
        0.5,
        "the dual-clip bound must exceed 1 (it caps the ratio of negative-advantage tokens "
        "from above; 3 is usual)",
        "set loss_fn.ratio_clip_c=3.0, or null to turn dual clipping off",
    )
    assert problems["checkpointing.save_period"] == (
        0, "must be at least 1",
        "save every N >= 1 steps (checkpointing.enabled=false to save none)",
    )  # fmt: skip
    assert problems["cluster.num_nodes"] == (
        0, "must be at least 1", "set cluster.num_nodes to a positive integer",
    )  # fmt: skip
    assert problems["grpo.seed"] == (
        -1,
        "must be in 0..4,294,967,295: vLLM seeds numpy with it, and numpy takes 32-bit seeds "
        "(torch would take 64)",
        "set grpo.seed to a number in that range, e.g. 42",
    )


def test_a_field_with_two_bounds_says_the_one_it_is_outside():
    (low,) = problems_for(policy__max_total_sequence_length=0)
    (high,) = problems_for(policy__max_total_sequence_length=2**30)
    assert (low.message, low.fix) == (
        "must be at least 1", "set policy.max_total_sequence_length to a positive integer",
    )  # fmt: skip
    assert high.message.startswith("must be at most 16,777,216: longer than any model's")


def test_profile_fields_are_bounded_beside_them_too():
    profile = structure_profile(
        {"name": "site", "ray_ports": {"gcs_port": 80}, "slurm": {"mem_gb": 0, "max_requeues": -1}}
    )
    problems = shown(check_profile(profile))
    assert problems["ray_ports.gcs_port"] == (80, "not a TCP port", "use a port in 1024..32767")
    assert problems["slurm.mem_gb"] == (0, "must be at least 1", "or remove it for Slurm's default")
    assert problems["slurm.max_requeues"][1].startswith("must be in 0..65,535: Slurm counts")


@attrs.frozen(kw_only=True)
class _Item:
    count: int = bounded(1, at_least(1, "set {path} to 1 or more"))


@attrs.frozen(kw_only=True)
class _Section:
    items: tuple[_Item, ...] = ()
    share: float = bounded(0.5, FieldBound(low=0.0, high=1.0, fix="e.g. 0.5"))
    off: _Item | None = None


def test_the_walk_names_list_items_by_index_and_skips_unset_sections_and_non_numbers():
    section = _Section(items=(_Item(), _Item(count=0), _Item(count=-2)), share=1.5)
    assert [problem.format() for problem in check_field_bounds(section, "top")] == [
        "error: top.items[1].count = 0: must be at least 1\n  fix: set top.items[1].count to 1 or more",
        "error: top.items[2].count = -2: must be at least 1\n  fix: set top.items[2].count to 1 or more",
        "error: top.share = 1.5: must be in [0, 1]\n  fix: e.g. 0.5",
    ]
    assert check_field_bounds(_Section(share=True)) == []  # a boolean is the converter's to refuse


def test_a_bound_with_a_switch_holds_only_while_its_section_is_enabled():
    on = shown(problems_for(policy__megatron_cfg__tensor_model_parallel_size=0))
    assert on["policy.megatron_cfg.tensor_model_parallel_size"] == (
        0, "a parallel size must be at least 1",
        "set policy.megatron_cfg.tensor_model_parallel_size=1 (or larger)",
    )  # fmt: skip
    off = problems_for("automodel", policy__megatron_cfg__tensor_model_parallel_size=0)
    assert "policy.megatron_cfg.tensor_model_parallel_size" not in shown(off)


def test_a_when_switch_is_looked_up_in_the_nearest_enclosing_section_that_has_it():
    """``optimizer_offload_fraction`` (``when="enabled"``) lives in
    ``policy.megatron_cfg.optimizer``, which has no ``enabled``: ``policy.megatron_cfg``'s
    switch decides."""
    from hpcrl.config.field_bounds import check_field_bounds
    from hpcrl.config.recipe_megatron import MegatronCfg, MegatronOptimizerCfg

    optimizer = MegatronOptimizerCfg(optimizer_offload_fraction=1.5)
    assert check_field_bounds(MegatronCfg(enabled=False, optimizer=optimizer)) == []
    (problem,) = check_field_bounds(MegatronCfg(enabled=True, optimizer=optimizer), "m")
    assert (problem.path, problem.value) == ("m.optimizer.optimizer_offload_fraction", 1.5)
    assert problem.message == "must be in [0, 1]: the share of optimizer state kept on the CPU"


def test_a_when_switch_must_be_on_in_every_enclosing_section_that_has_it():
    """LoRA's rank is checked only while both ``lora_cfg.enabled`` and
    ``automodel_cfg.enabled`` are on; a tuple names several switches of a section."""
    from hpcrl.config.field_bounds import check_field_bounds
    from hpcrl.config.recipe_lora import LoraCfg
    from hpcrl.config.recipe_megatron import MegatronCfg
    from hpcrl.config.recipe_policy import AutomodelCfg

    lora = LoraCfg(enabled=True, dim=0)
    assert check_field_bounds(AutomodelCfg(enabled=False, lora_cfg=lora)) == []
    assert check_field_bounds(AutomodelCfg(enabled=True, lora_cfg=LoraCfg(dim=0))) == []
    (problem,) = check_field_bounds(AutomodelCfg(enabled=True, lora_cfg=lora), "a")
    assert (problem.path, problem.message) == ("a.lora_cfg.dim", "the LoRA rank must be at least 1")
    recompute = {"recompute_num_layers": 0}
    assert check_field_bounds(MegatronCfg(enabled=True, **recompute)) == []
    (problem,) = check_field_bounds(
        MegatronCfg(enabled=True, activation_checkpointing=True, **recompute), "m"
    )
    assert problem.path == "m.recompute_num_layers"


def test_a_bound_with_its_own_switch_holds_only_while_it_is_on_and_a_field_is_reported_once():
    """``optimizer_offload_fraction``: [0, 1] while Megatron is enabled, and above 0 while
    ``optimizer_cpu_offload`` is on too; a value outside both is reported by the first."""
    from hpcrl.config.recipe_megatron import MegatronCfg, MegatronOptimizerCfg

    def fraction_problems(enabled, offload, fraction):
        optimizer = MegatronOptimizerCfg(
            optimizer_cpu_offload=offload, optimizer_offload_fraction=fraction
        )
        return check_field_bounds(MegatronCfg(enabled=enabled, optimizer=optimizer), "m")

    assert fraction_problems(enabled=True, offload=False, fraction=0.0) == []
    assert fraction_problems(enabled=False, offload=True, fraction=0.0) == []
    assert fraction_problems(enabled=True, offload=True, fraction=0.5) == []
    (zero,) = fraction_problems(enabled=True, offload=True, fraction=0.0)
    assert (zero.path, zero.value) == ("m.optimizer.optimizer_offload_fraction", 0.0)
    assert zero.message == (
        "must be above 0 when m.optimizer.optimizer_cpu_offload is true (the share of "
        "optimizer state kept on the CPU; 0 keeps none there)"
    )
    assert zero.fix == (
        "set m.optimizer.optimizer_offload_fraction to e.g. 0.5 or 1.0, or "
        "m.optimizer.optimizer_cpu_offload=false"
    )
    (negative,) = fraction_problems(enabled=True, offload=True, fraction=-0.5)
    assert negative.message == "must be in [0, 1]: the share of optimizer state kept on the CPU"
