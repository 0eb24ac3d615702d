"""The keys outside the schema, as the NeMo RL filter finds and judges them: the converter
names them while structuring (no second walk over the recipe), and ``foreign_keys`` is a
table asked about one such key at a time."""

from hpcrl.config.converter import keys_outside_schema
from hpcrl.config.errors import NO_VALUE
from hpcrl.config.foreign_keys import take_out_foreign_keys
from hpcrl.config.recipe import Recipe
from tests.recipe_builder import base_dict, with_keys

KWARGS = ("policy", "automodel_cfg", "automodel_kwargs")


def test_structuring_names_every_key_outside_the_schema_beside_other_mistakes():
    data = with_keys(
        base_dict(),
        policy__megatron_cfg__optimizer__zzz=1,
        policy__megatron_cfg__tensor_model_parallel_size="two",  # a mistake in the same section
        policy__megatron_cfg__converter_type="Qwen2ForCausalLM",
        dpo={"max_num_steps": 1},
    )
    found = keys_outside_schema(data, Recipe)
    assert sorted(found, key=repr) == sorted(
        [
            (("policy", "megatron_cfg", "optimizer"), "zzz"),
            (("policy", "megatron_cfg"), "converter_type"),
            ((), "dpo"),
        ],
        key=repr,
    )
    assert keys_outside_schema(base_dict(), Recipe) == []


def test_keys_inside_list_items_are_left_to_the_converter():
    data = with_keys(base_dict(), policy__scheduler=[{"name": "x.Y", "kwargs": {}, "typo": 1}])
    assert keys_outside_schema(data, Recipe) == []


def test_entries_below_a_key_go_first_in_table_order_then_its_own_takes_the_rest():
    value = {"force_hf": True, "backend": {"fake_balanced_gate": True, "x": 1}, "foo": 1}
    taken, rest = take_out_foreign_keys(KWARGS, value)
    assert [(t.parts[len(KWARGS) :], t.value, t.refusal is None) for t in taken] == [
        (("force_hf",), True, True),
        (("backend", "fake_balanced_gate"), True, False),
        (("backend",), {"x": 1}, True),
        ((), {"foo": 1}, False),
    ]
    assert rest is NO_VALUE
    assert [t.order for t in taken] == sorted(t.order for t in taken)
    refusal = taken[-1].refusal
    assert refusal is not None and refusal.path == ".".join(KWARGS)
    assert refusal.fix == "remove policy.automodel_cfg.automodel_kwargs or set it to null or {}"


def test_a_key_with_entries_only_below_it_keeps_the_rest_for_the_registry():
    parts = ("policy", "generation", "mcore_generation_config")
    value = {"buffer_size_gb": 2, "other": 1}
    taken, rest = take_out_foreign_keys(parts, value)
    assert [(t.parts[-1], t.value, t.refusal) for t in taken] == [("buffer_size_gb", 2, None)]
    assert rest == {"other": 1}
    untouched = {"a": 1}
    assert take_out_foreign_keys(("policy", "nothing_known"), untouched) == ([], untouched)
