"""Inputs that used to take the login node's time and memory (issue 26): a file far larger than
any recipe, one with more YAML nodes than any recipe (aliases expanded), ``${}`` references
that double at every key or chain through thousands of keys, a ``defaults:`` naming a device.
Each is refused within a deadline, with its own message naming the file or key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrl.config import ConfigError, load_recipe
from hpcrl.config.interpolation_size import oversized_values
from hpcrl.config.yaml_limits import count_yaml_nodes
from tests.robust.harness import deadline

BASE = "defaults: grpo-tiny-1n-cpu.yaml\n"
NAME = "logger:\n  wandb:\n    name: "
DEADLINE_S = 20.0  # the refusals take about a second; before, minutes (or memory) ran out


def problems(path: Path) -> list[str]:
    with deadline(DEADLINE_S), pytest.raises(ConfigError) as caught:
        load_recipe(path)
    return [problem.format() for problem in caught.value.errors]


def aliases_of(level: int) -> str:
    """``l<level>``: a list of ten aliases of the level below (``a`` below level 1)."""
    below = "a" if level == 1 else f"l{level - 1}"
    return f"l{level}: &l{level} [{', '.join([f'*{below}'] * 10)}]\n"


def doubling(levels: int, first: str = "ab") -> str:
    keys = [f"s{i}: ${{s{i - 1}}}${{s{i - 1}}}" for i in range(1, levels + 1)]
    return f"{BASE}{NAME}${{s{levels}}}\ns0: {first}\n" + "\n".join(keys)


def test_a_file_larger_than_any_recipe_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("x: [" + ",".join(["1"] * 1_000_000) + "]\n")
    assert problems(path) == [
        f"error: {path}: 2,000,005 bytes: larger than any recipe or profile (at most 1,048,576 "
        "bytes; the largest NeMo RL config is 25 KB)\n"
        "  fix: check that this is the file you meant: a recipe or profile holds a few hundred "
        "keys (data belongs in a data file, data.train_path)"
    ]


@pytest.mark.parametrize(
    "text",
    [
        BASE + "x:\n" + "".join(f"  k{i}: {i}\n" for i in range(12_000)),
        # ten times ten ... aliases: a few hundred bytes that expand to 10**9 nodes
        "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(aliases_of(i) for i in range(1, 9)),
    ],
    ids=["12000-keys", "alias-expansion"],
)  # fmt: skip
def test_more_yaml_nodes_than_any_recipe_is_its_own_message(tmp_path, text):
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    assert problems(path) == [
        f"error: {path}: more than 10,000 YAML nodes (keys, values and list items, aliases "
        "counted as what they expand to): more than any recipe or profile (the largest NeMo RL "
        "config holds under 1,000)\n"
        "  fix: check that this is the file you meant: a recipe or profile holds a few hundred "
        "keys (data belongs in a data file, data.train_path)"
    ]


def test_nesting_deeper_than_any_recipe_is_its_own_message(tmp_path):
    """200 nested lists: OmegaConf's recursive build ended in an internal RecursionError."""
    path = tmp_path / "deep.yaml"
    path.write_text(BASE + "a: " + "[" * 200 + "]" * 200 + "\n")
    assert problems(path) == [
        f"error: {path}: sequences and mappings nested more than 32 deep: deeper than any "
        "recipe or profile (NeMo RL's example configs nest 8 deep at most)\n"
        "  fix: check that this is the file you meant: a recipe or profile holds a few hundred "
        "keys (data belongs in a data file, data.train_path)"
    ]
    path.write_text(BASE + "a: " + "[" * 31 + "]" * 31 + "\n")  # 32 deep with the file's map
    (at_the_limit,) = problems(path)  # built and resolved; only the unknown key is refused
    assert at_the_limit.startswith("error: a = [[[[") and "nested" not in at_the_limit


def test_node_counts_expand_aliases_and_stop_at_the_limit():
    assert count_yaml_nodes(b"a: &x {b: 1, c: [1, 2]}\nd: *x\n", 100) == 17
    assert count_yaml_nodes(b"a: [" + b"1," * 50_000 + b"1]\n", 100) == 101
    assert count_yaml_nodes(b"a: [1, 2\n", 100) == 5  # a syntax error ends the count


def test_doubling_interpolation_is_refused_with_the_key_where_it_starts(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(doubling(39))
    found = [text for text in problems(path) if "lookups" in text]
    assert found == [
        "error: s5: its ${...} references take 62 lookups to resolve (at most 40): values that "
        "use each other more than once, or through a long chain of keys, grow with every level; "
        "35 more key(s) built from it are left out too\n"
        "  fix: refer to each value once (${a.b} copies the whole value of a.b), or write it out"
    ]


def test_a_value_resolving_past_a_megabyte_is_refused(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text(f"{BASE}s0: {'x' * 400_000}\n{NAME}'${{s0}}${{s0}}${{s0}}'\n")
    assert problems(path)[0] == (
        "error: logger.wandb.name: its ${...} references resolve to about 1,200,000 characters, "
        "more than any value needs (at most 1,048,576): values that use each other more than "
        "once, or through a long chain of keys, grow with every level\n"
        "  fix: refer to each value once (${a.b} copies the whole value of a.b), or write it out"
    )


def test_a_long_reference_chain_is_refused_in_either_order(tmp_path):
    forward = [f"x{i}: ${{x{i - 1}}}" for i in range(1, 3000)]
    for name, lines in (("forward", forward), ("backward", forward[::-1])):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"{BASE}{NAME}'${{x2999}}'\nx0: ab\n" + "\n".join(lines))
        assert [text.split(":")[1] for text in problems(path) if "lookups" in text] == [" x41"]


def test_ordinary_references_are_measured_exactly():
    raw = {
        "policy": {"n": 512, "gen": {"len": "${policy.n}", "same": "${.len}", "up": "${..n}"}},
        "name": "run-${policy.n}-${oc.env:HPCRL_SIZE_TEST,x}",
        "escaped": "\\${policy.n}",
    }
    assert oversized_values(raw, {"HPCRL_SIZE_TEST": "abc"}) == {}
    huge = {"a": "x" * 600_000, "b": "${a}${a}", "c": "${b}"}
    found = oversized_values(huge, {})
    assert set(found) == {("b",), ("c",)} and found[("c",)] is None  # c grows because of b


def test_defaults_naming_a_device_says_what_it_is(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("defaults: /dev/zero\n")
    assert problems(path)[0] == (
        f"error: defaults (in {path}) = '/dev/zero': /dev/zero is a character device, not a YAML "
        "file\n  fix: name a YAML file (a base recipe or profile)"
    )
    assert problems(Path("/dev/zero")) == [
        "error: recipe = '/dev/zero': a character device, not a YAML file\n  fix: give a YAML file"
    ]
