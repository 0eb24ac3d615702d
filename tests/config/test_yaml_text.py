"""hpcrl.config.yaml_text reads YAML exactly as OmegaConf's own loader does, without it:
same values of the same types in the same order, and the same errors."""

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf._yaml import get_yaml_loader  # omegaconf 2.4's loader (2.3 kept it in _utils)

from hpcrl.config.yaml_loader import MAX_NODES_VARIABLE, load_yaml_text
from hpcrl.config.yaml_text import load_yaml
from tests.nemo_rl_snapshots import RELEASES, REPO_ROOT, release_root


def _outcome(read, text: str) -> tuple[str, str]:
    """What reading gives: the data's repr (types and order show), or the error's words."""
    try:
        return "data", repr(read(text))
    except Exception as exc:  # the comparison is of whatever each raises
        return type(exc).__name__, str(exc)


def _ours(text: str):
    return load_yaml_text(text)


def _omegaconfs(text: str):
    return yaml.load(text, Loader=get_yaml_loader())  # noqa: S506  (OmegaConf's safe loader)


def test_every_config_reads_as_omegaconf_reads_it():
    files = [path for release in RELEASES for path in sorted(release_root(release).rglob("*.yaml"))]
    files += sorted((REPO_ROOT / "recipes").rglob("*.yaml"))
    files += sorted((REPO_ROOT / "cluster_profiles").glob("*.yaml"))
    assert len(files) > 650
    differing = [
        str(path)
        for path in files
        if _outcome(_ours, text := path.read_text()) != _outcome(_omegaconfs, text)
    ]
    assert differing == []


def test_a_file_reads_as_omegaconf_load_reads_it():
    path = REPO_ROOT / "recipes" / "base" / "grpo.yaml"
    assert load_yaml(path) == OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def _deep_aliases(levels: int, width: int) -> str:
    lines = ["l0: &l0 [" + ", ".join(["1"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


SAME_AS_OMEGACONF = {
    "yaml 1.2 floats": "a: 1e-5\nb: 1_000.5e3\nc: .5\nd: 1:30.5\ne: -.inf\nf: .NaN\n"
    "g: +1E-3\nh: 1_000\ni: 0x1F\nj: 1.\nk: .5e+3\nl: 1e5x\n",
    "no timestamps": "d: 2024-01-01\nt: 2001-12-14t21:59:43.10-05:00\n",
    "booleans and nulls": "a: yes\nb: off\nc: ~\nd: null\ne: True\n",
    "duplicate key": "a: 1\nb: 2\na: 3\n",
    "nested duplicate key": "x:\n  a: 1\n  b:\n    c: 1\n    c: 2\n",
    "duplicate key in a flow mapping": "x: {a: 1, a: 2}\n",
    "duplicate int keys are kept last": "1: a\n1: b\n",
    "merge: the written key wins in its place": "b: &b {a: 1, z: 2}\nd:\n  a: 9\n  <<: *b\n  c: 3\n",
    "merge of a list": "x: &x {a: 1}\ny: &y {a: 2, b: 3}\nz:\n  c: 4\n  <<: [*x, *y]\n",
    "merge nested": "x: &x {a: 1}\ny: &y {<<: *x, b: 2}\nz: {<<: *y, a: 5}\n",
    "merge twice the same anchor": "x: &x {a: 1}\ny: &y {<<: [*x, *x]}\nz: {<<: *y}\n",
    "two merge keys": "x: &x {a: 1}\ny: &y {a: 2, b: 1}\nz:\n  <<: *x\n  c: 0\n  <<: *y\n",
    "merge of a scalar": "a: 1\nb:\n  <<: 5\n",
    "merge of a list of scalars": "b:\n  <<: [1]\n",
    "value key": "a:\n  =: 1\n  b: 2\n",
    "recursive alias": "a: &a [1, *a]\n",
    "recursive mapping alias": "a: &a {b: *a}\n",
    "paths": "p: !!python/object/apply:pathlib.Path ['/tmp', 'x']\n"
    "q: !!python/object/apply:pathlib.PosixPath ['a']\n",
    "unsafe tag": "p: !!python/object/apply:os.system ['true']\n",
    "syntax error": "a: [1,\n",
    "bad indentation": "a:\n  b: 1\n c: 2\n",
    "empty": "",
    "comment only": "# nothing\n",
    "a list": "- 1\n- two\n",
    "tabs": "a:\t1\n",
    "aliases under the limits": _deep_aliases(3, 9),
}


@pytest.mark.parametrize("case", SAME_AS_OMEGACONF)
def test_reads_as_omegaconf_reads_it(case):
    text = SAME_AS_OMEGACONF[case]
    assert _outcome(_ours, text) == _outcome(_omegaconfs, text)


def test_a_duplicate_key_is_an_error_naming_the_key():
    kind, message = _outcome(_ours, "a: 1\nb: 2\na: 3\n")
    assert kind == "ConstructorError"
    assert "found duplicate key a" in message and "line 3, column 1" in message


def test_yaml_12_floats_and_no_timestamps():
    assert load_yaml_text("a: 1e-5\nb: 2024-01-01\nc: 1_000\n") == {
        "a": 1e-5, "b": "2024-01-01", "c": 1000,
    }  # fmt: skip


TOO_LARGE = {
    "alias growth past 100x": _deep_aliases(4, 9),  # 7381 nodes from 40 written
    "past 10,000 nodes": "x: [" + ", ".join(["1"] * 10_001) + "]\n",
    "billion laughs": _deep_aliases(9, 10),
}


@pytest.mark.parametrize("case", TOO_LARGE)
def test_too_large_a_document_is_refused_as_omegaconf_refuses_it(case):
    text = TOO_LARGE[case]
    with pytest.raises(yaml.constructor.ConstructorError) as ours:
        load_yaml_text(text)
    with pytest.raises(yaml.constructor.ConstructorError) as omegaconfs:
        _omegaconfs(text)
    assert ours.value.problem_mark.line == omegaconfs.value.problem_mark.line
    assert ours.value.problem.split(" ")[:4] == omegaconfs.value.problem.split(" ")[:4]


@pytest.mark.parametrize(
    ("limit", "case"),
    [
        ("none", "past 10,000 nodes"),
        ("20000", "past 10,000 nodes"),
        ("5", "alias growth past 100x"),
        ("0", "billion laughs"),
        ("many", "billion laughs"),
    ],
)
def test_the_node_limit_follows_omegaconfs_variable(monkeypatch, limit, case):
    monkeypatch.setenv(MAX_NODES_VARIABLE, limit)
    text = TOO_LARGE[case]
    assert _outcome(_ours, text) == _outcome(_omegaconfs, text) or (
        _outcome(_ours, text)[0] == _outcome(_omegaconfs, text)[0] == "ConstructorError"
    )


def test_an_empty_file_is_an_empty_mapping(tmp_path: Path):
    (tmp_path / "empty.yaml").write_text("")
    assert load_yaml(tmp_path / "empty.yaml") == {}
