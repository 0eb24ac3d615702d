"""A plain config (hpcrl.config.plain_config) merges to what OmegaConf's path gives, without
importing omegaconf."""

from pathlib import Path

import pytest

from hpcrl.config.merged_yaml import BaseSearch, _load_tree, load_merged
from hpcrl.config.plain_config import is_plain
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from tests.nemo_rl_snapshots import RELEASES, REPO_ROOT, release_root

RECIPE_SEARCH = BaseSearch(folders=(REPO_ROOT / "recipes",), what="recipe")
PROFILE_SEARCH = BaseSearch(folders=(REPO_ROOT / "cluster_profiles",), own_keys=("name",))


def _both_paths(path: Path, schema: type, search: BaseSearch = RECIPE_SEARCH):
    plain = load_merged(path, (), schema, search=search)
    through = load_merged(path, (), schema, search=search, through_omegaconf=True)
    return plain, through


def _shipped() -> list[tuple[Path, type, BaseSearch]]:
    recipes = [
        (path, Recipe, RECIPE_SEARCH) for path in sorted((REPO_ROOT / "recipes").glob("*.yaml"))
    ]
    profiles = [
        (path, ClusterProfile, PROFILE_SEARCH)
        for path in sorted((REPO_ROOT / "cluster_profiles").glob("*.yaml"))
    ]
    return recipes + profiles


def test_every_shipped_recipe_and_profile_merges_as_through_omegaconf():
    plain_ones = []
    for path, schema, search in _shipped():
        plain, through = _both_paths(path, schema, search)
        assert plain == through, path
        assert plain.resolved is not plain.raw
        if is_plain(through.raw):
            plain_ones.append(path.name)
            _assert_independent(plain.resolved, plain.raw)
    # base/grpo.yaml interpolates (${policy.max_total_sequence_length}): its recipes don't
    assert {"sft-tiny-1n-cpu.yaml", "local.yaml", "slurm-test.yaml"} <= set(plain_ones)
    assert "grpo-tiny-1n-cpu.yaml" not in plain_ones


def _assert_independent(resolved: dict, raw: dict) -> None:
    for key, value in resolved.items():
        if isinstance(value, (dict, list)):
            assert value is not raw.get(key), key
            if isinstance(value, dict) and isinstance(raw.get(key), dict):
                _assert_independent(value, raw[key])


def test_nemo_rl_configs_that_are_plain_merge_as_through_omegaconf():
    compared = 0
    for release in RELEASES:
        for path in sorted((release_root(release) / "examples" / "configs").rglob("*.yaml")):
            data, _, _ = _load_tree(path, (), BaseSearch())  # merged, nothing resolved
            if data is None or not is_plain(data):
                continue
            plain = load_merged(path, (), Recipe)
            assert plain == load_merged(path, (), Recipe, through_omegaconf=True), path
            compared += 1
    assert compared >= 10


def test_a_leftover_old_section_name_is_dropped_as_through_omegaconf(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "policy:\n  dtensor_cfg: {enabled: true}\n  automodel_cfg: {enabled: false}\n"
    )
    plain, through = _both_paths(recipe, Recipe)
    assert plain == through
    assert "dtensor_cfg" not in plain.resolved["policy"]


@pytest.mark.parametrize(
    "text",
    [
        "a: ${b}\nb: 1\n",
        "a: '???'\n",
        "a: [x, 'y${b}']\nb: 1\n",
        "1: one\n",
        "a: !!python/object/apply:pathlib.Path ['/tmp']\n",
        "a: " + "x" * 2_000_000 + "\n",
    ],
)
def test_what_omegaconf_reads_otherwise_is_not_plain(tmp_path, text):
    from hpcrl.config.yaml_loader import load_yaml_text

    if len(text) > 1_000_000:  # too large a file is refused before parsing: the value itself
        data = {"a": "x" * 2_000_000}
    else:
        data = load_yaml_text(text)
    assert not is_plain(data)
