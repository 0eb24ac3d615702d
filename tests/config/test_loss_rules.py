"""Rules of issue 15: loss settings NeMo RL asserts on the GPUs, and layouts whose gradients
would be wrong (Megatron context parallelism, per-token loss override, Automodel CP)."""

import pytest

from tests.recipe_builder import only, problems_for

M = "policy.megatron_cfg"


@pytest.mark.parametrize(
    "c, ok", [(None, True), (3.0, True), (1.01, True), (1.0, False), (0.5, False)]
)
def test_dual_clip_must_exceed_one(c, ok):
    problems = problems_for(loss_fn__ratio_clip_c=c)
    if ok:
        assert problems == []
        return
    problem = only(problems)
    assert (problem.path, problem.value) == ("loss_fn.ratio_clip_c", c)
    assert "must exceed 1" in problem.message and "ratio_clip_c=3.0" in problem.fix


@pytest.mark.parametrize("name", ["kl_input_clamp_value", "kl_output_clamp_value"])
def test_kl_clamps_positive_or_null(name):
    assert problems_for(**{f"loss_fn__{name}": None}) == []
    problem = only(problems_for(**{f"loss_fn__{name}": 0.0}))
    assert (problem.path, problem.value) == (f"loss_fn.{name}", 0.0)


def _tis(**keys):
    dotted = {f"loss_fn__truncated_importance_sampling_{k}": v for k, v in keys.items()}
    return problems_for(loss_fn__use_importance_sampling_correction=True, **dotted)


def test_truncated_importance_sampling_valid_settings():
    assert _tis(type="tis", ratio=2.0) == []
    assert _tis(type="tis", ratio=2.0, ratio_min=0.5) == []
    assert _tis(type="icepop", ratio=5.0, ratio_min=0.5) == []
    assert _tis(type="seq-mask-tis", ratio=1.002, ratio_min=0.999) == []


def test_truncated_importance_sampling_needs_the_correction_on():
    problems = problems_for(
        loss_fn__truncated_importance_sampling_type="tis",
        loss_fn__truncated_importance_sampling_ratio=2.0,
    )
    problem = only(problems)
    assert problem.path == "loss_fn.use_importance_sampling_correction"
    assert "use_importance_sampling_correction=true" in problem.fix


@pytest.mark.parametrize(
    "keys, path",
    [
        ({"type": "tis"}, "loss_fn.truncated_importance_sampling_ratio"),
        ({"type": "tis", "ratio": 0.0}, "loss_fn.truncated_importance_sampling_ratio"),
        ({"type": "icepop", "ratio": 5.0}, "loss_fn.truncated_importance_sampling_ratio_min"),
        ({"type": "seq-mask-tis", "ratio": 1.1}, "loss_fn.truncated_importance_sampling_ratio_min"),
        (
            {"type": "icepop", "ratio": 2.0, "ratio_min": 3.0},
            "loss_fn.truncated_importance_sampling_ratio_min",
        ),
        ({"ratio": 2.0}, "loss_fn.truncated_importance_sampling_type"),
    ],
)
def test_truncated_importance_sampling_bad_settings_name_their_key(keys, path):
    assert only(_tis(**keys)).path == path


def test_unknown_truncation_type_is_a_schema_error():
    from hpcrl.config import structure_recipe
    from hpcrl.config.errors import ConfigError
    from tests.recipe_builder import base_dict, with_keys

    data = with_keys(
        base_dict("megatron", "grpo"), loss_fn__truncated_importance_sampling_type="tiss"
    )
    with pytest.raises(ConfigError, match="truncated_importance_sampling_type"):
        structure_recipe(data)


def test_grpo_refuses_greedy_sampling_sft_does_not_care():
    problem = only(problems_for(policy__generation__temperature=0.0))
    assert problem.path == "policy.generation.temperature"
    assert "every advantage is 0" in problem.message
    assert problems_for(algorithm="sft", policy__generation__temperature=0.0) == []


def test_megatron_context_parallel_is_accepted():
    # Built (tests/megatron/test_context_parallel.py); packs are cut to 2 x CP by the batching.
    assert problems_for(policy__megatron_cfg__context_parallel_size=2) == []
    assert (
        problems_for(
            policy__megatron_cfg__context_parallel_size=4, policy__sequence_packing__enabled=True
        )
        == []
    )


def test_per_token_loss_override_is_refused_false_is_fine():
    key = f"{M}.model_overrides.calculate_per_token_loss"
    problem = only(
        problems_for(policy__megatron_cfg__model_overrides={"calculate_per_token_loss": True})
    )
    assert (problem.path, problem.value) == (key, True)
    assert "DP times too large" in problem.message
    assert (
        problems_for(policy__megatron_cfg__model_overrides={"calculate_per_token_loss": False})
        == []
    )


def test_gspo_loads_with_a_per_sequence_loss_as_nemo_rl_asserts():
    gspo = {"loss_fn__sequence_level_importance_ratios": True}
    assert problems_for(loss_fn__token_level_loss=False, **gspo) == []
    problem = only(problems_for(**gspo))
    assert problem.path == "loss_fn.token_level_loss"
    assert problem.fix == (
        "set loss_fn.token_level_loss=false, or loss_fn.sequence_level_importance_ratios=false"
    )
    problem = only(
        problems_for(
            loss_fn__token_level_loss=False,
            loss_fn__use_importance_sampling_correction=True,
            **gspo,
        )
    )
    assert problem.path == "loss_fn.use_importance_sampling_correction"


def test_cispo_alone_loads():
    assert problems_for(loss_fn__use_cispo=True) == []


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        ("ratio_clip_c", 3.0, "set loss_fn.ratio_clip_c=null, or loss_fn.use_cispo=false"),
        (
            "token_level_loss",
            False,
            "set loss_fn.token_level_loss=true, or loss_fn.use_cispo=false",
        ),
        (
            "sequence_level_importance_ratios",
            True,
            "set loss_fn.sequence_level_importance_ratios=false, or loss_fn.use_cispo=false",
        ),
    ],
)
def test_cispo_refuses_what_replaces_its_per_token_ratio(key, value, fix):
    """NeMo RL asserts each of these in its loss function, on the GPUs."""
    found = [
        p
        for p in problems_for(loss_fn__use_cispo=True, **{f"loss_fn__{key}": value})
        if p.path == f"loss_fn.{key}" and "use_cispo" in p.message
    ]
    assert [p.fix for p in found] == [fix]
