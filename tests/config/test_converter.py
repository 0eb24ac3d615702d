"""The strict converter: unknown keys, types, choices, lists; every problem with its path."""

import pytest

from hpcrl.config import ConfigError, structure_profile, structure_recipe, unstructure
from hpcrl.config.errors import NO_VALUE
from tests.recipe_builder import base_dict, with_keys


def problems_of(data, structure=structure_recipe):
    with pytest.raises(ConfigError) as caught:
        structure(data)
    return {problem.path: problem for problem in caught.value.problems}


def test_unknown_key_has_full_path_and_did_you_mean():
    problems = problems_of(
        with_keys(base_dict(), policy__megatron_cfg__optimizer__optimizer_ofload_fraction=0.5)
    )
    problem = problems["policy.megatron_cfg.optimizer.optimizer_ofload_fraction"]
    assert problem.value == 0.5 and problem.message == "unknown key 'optimizer_ofload_fraction'"
    assert problem.fix == "did you mean policy.megatron_cfg.optimizer.optimizer_offload_fraction?"


def test_unknown_key_without_close_match_lists_allowed_keys():
    problem = problems_of(with_keys(base_dict(), cluster__zzz=1))["cluster.zzz"]
    assert "num_nodes, gpus_per_node" in problem.fix


def test_unknown_top_level_section():
    problem = problems_of(with_keys(base_dict(), gpro={}))["gpro"]
    assert problem.fix == "did you mean grpo?"


def test_all_mistakes_are_reported_together():
    data = with_keys(
        base_dict(),
        policy__precison="bfloat16",
        policy__train_micro_batch_size=True,
        cluster__gpus_per_node="eight",
    )
    del data["policy"]["model_name"]
    problems = problems_of(data)
    assert sorted(problems) == [
        "cluster.gpus_per_node",
        "policy.model_name",
        "policy.precison",
        "policy.train_micro_batch_size",
    ]
    assert problems["policy.model_name"].value is NO_VALUE
    assert problems["policy.model_name"].message == "required key is missing"


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("policy__train_global_batch_size", True, "expected an integer, got a boolean"),
        ("policy__train_global_batch_size", "8", "expected an integer, got the string '8'"),
        ("policy__megatron_cfg__enabled", "yes please", "expected true or false"),
        ("policy__megatron_cfg__enabled", 1, "expected true or false"),
        ("policy__megatron_cfg__optimizer__lr", False, "expected a number"),
        ("policy__model_name", 7, "expected a string, got the number 7"),
        ("policy__megatron_cfg__recompute_modules", "moe", "expected a list"),
        ("policy__megatron_cfg__env_vars", ["A=1"], "expected a mapping"),
    ],
)
def test_wrong_types_are_named(key, value, words):
    path = key.replace("__", ".")
    problem = problems_of(with_keys(base_dict(), **{key: value}))[path]
    assert words in problem.message and problem.value == value


def test_literal_lists_the_choices_and_guesses():
    problem = problems_of(with_keys(base_dict(), policy__precision="bf16"))["policy.precision"]
    assert problem.message == "'bf16' is not one of: float32, bfloat16, float16"
    assert "policy.precision to one of: float32, bfloat16, float16" in problem.fix


def test_cuda_graph_impl_choices():
    problem = problems_of(with_keys(base_dict(), policy__megatron_cfg__cuda_graph_impl="te"))
    assert (
        "none, local, transformer_engine, full_iteration"
        in problem["policy.megatron_cfg.cuda_graph_impl"].message
    )


def test_list_items_are_checked_with_their_index():
    problem = problems_of(with_keys(base_dict(), policy__generation__stop_strings=["ok", 3]))
    assert "policy.generation.stop_strings[1]" in problem


def test_base60_time_is_explained():
    problem = problems_of({"name": "x", "slurm": {"time_limit": 14400}}, structure_profile)[
        "slurm.time_limit"
    ]
    assert "base-60" in problem.message and '"04:00:00"' in problem.fix


def test_yaml_lists_become_tuples_and_env_numbers_strings():
    recipe = structure_recipe(
        with_keys(
            base_dict(),
            policy__megatron_cfg__offload_modules=["core_attn"],
            policy__megatron_cfg__env_vars={"N": 1},
        )
    )
    assert recipe.policy.megatron_cfg.offload_modules == ("core_attn",)
    assert recipe.policy.megatron_cfg.env_vars == {"N": "1"}


def test_env_booleans_must_be_quoted():
    problem = problems_of(with_keys(base_dict(), policy__megatron_cfg__env_vars={"X": True}))[
        "policy.megatron_cfg.env_vars.X"
    ]
    assert "quote it" in problem.fix


def test_unstructure_round_trips():
    recipe = structure_recipe(
        with_keys(base_dict(), policy__megatron_cfg__offload_modules=["core_attn"])
    )
    plain = unstructure(recipe)
    assert plain["policy"]["megatron_cfg"]["offload_modules"] == ["core_attn"]
    assert structure_recipe(plain) == recipe


def test_problem_text_names_path_value_and_fix():
    with pytest.raises(ConfigError) as caught:
        structure_recipe(with_keys(base_dict(), policy__precision="bf16"))
    text = str(caught.value)
    assert "error: policy.precision = 'bf16': 'bf16' is not one of" in text
    assert "\n  fix: " in text and text.endswith("1 error, 0 warnings")
