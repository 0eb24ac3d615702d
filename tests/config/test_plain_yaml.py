"""The OmegaConf-free fast path reads and resolves exactly as OmegaConf does, or declines."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import hpcrl.config.loader as loader
from hpcrl.config.plain_yaml import read_plain_yaml, resolve_references
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "recipes").rglob("*.yaml")) + sorted(
    (REPO / "cluster_profiles").glob("*.yaml")
)


def omegaconf_read(path: Path):
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_shipped_files_take_the_fast_path_and_read_as_omegaconf_reads_them(path):
    data = read_plain_yaml(path)
    assert data is not None
    assert repr(data) == repr(omegaconf_read(path))  # repr: 1 and 1.0 and True differ


SCALARS = """\
a: 1e-5
b: 2.5E+3
c: .inf
d: -.inf
e: 1_000
f: 0o17
g: 0x1f
h: yes
i: off
j: 2024-01-02
k: 1:30
l: "1e-5"
m: null
n: ~
o: 12:30:00.5
p: 1.
q: -3
r: [1, two, 3.0]
"""


def test_scalars_are_typed_as_omegaconf_types_them(tmp_path):
    path = tmp_path / "scalars.yaml"
    path.write_text(SCALARS)
    assert repr(read_plain_yaml(path)) == repr(omegaconf_read(path))


@pytest.mark.parametrize(
    "text",
    [
        "a: &x 1\nb: *x\n",  # anchors and aliases
        "a: 1\na: 2\n",  # duplicate keys: OmegaConf's error
        "a: !!str 1\n",  # tags
        "a: ???\n",  # must be set
        "a: ${oc.env:HOME}\n",  # resolvers
        "a: x${b}\nb: 1\n",  # a reference inside a longer string
        "1: a\n",  # non-string keys
        "- a\n",  # not a mapping
        "",  # empty file
        "a: [\n",  # bad YAML: OmegaConf's message
    ],
)
def test_everything_else_is_left_to_omegaconf(tmp_path, text):
    path = tmp_path / "special.yaml"
    path.write_text(text)
    assert read_plain_yaml(path) is None


def test_references_resolve_through_chains_and_into_mappings():
    data = {"a": {"b": "${c}", "l": ["${a.x}"], "x": 2.0}, "c": "${d}", "d": {"e": [1, "${a.x}"]}}
    assert resolve_references(data) == {
        "a": {"b": {"e": [1, 2.0]}, "l": [2.0], "x": 2.0},
        "c": {"e": [1, 2.0]},
        "d": {"e": [1, 2.0]},
    }
    assert data["c"] == "${d}"  # the input is left as it was
    assert resolve_references({"a": "${b}", "b": "${a}"}) is None  # a cycle: OmegaConf's error
    assert resolve_references({"a": "${nope.x}"}) is None  # missing: OmegaConf's error


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_loading_gives_what_the_omegaconf_path_gives(path, monkeypatch):
    schema = ClusterProfile if path.parent.name == "cluster_profiles" else Recipe
    fast = loader.load_merged(path, (), schema)
    monkeypatch.setattr(loader, "read_plain_yaml", lambda path: None)
    monkeypatch.setattr(loader, "resolve_references", lambda data: None)
    slow = loader.load_merged(path, (), schema)
    assert repr(fast) == repr(slow)


def test_loading_a_shipped_recipe_and_profile_does_not_import_omegaconf():
    import subprocess
    import sys

    code = (
        "import sys; from hpcrl.config import load_profile, load_recipe; "
        "load_recipe('grpo-tiny-1n-cpu'); load_profile('local'); "
        "print(sorted(name for name in sys.modules if name.startswith('omegaconf')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.strip() == "[]"
