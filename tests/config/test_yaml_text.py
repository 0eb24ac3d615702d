"""hpcrl.config.yaml_text reads YAML exactly as OmegaConf.load does, faster."""

from pathlib import Path

from omegaconf import OmegaConf

from hpcrl.config.yaml_text import _omegaconf_yaml_loader, load_yaml
from tests.nemo_rl_snapshots import REPO_ROOT, release_root


def test_the_fast_path_is_taken_with_the_pinned_omegaconf():
    assert _omegaconf_yaml_loader() is not None


def test_every_config_reads_as_omegaconf_reads_it():
    files = sorted(release_root("main-7ea279a").rglob("*.yaml"))
    files += sorted((REPO_ROOT / "recipes").rglob("*.yaml"))
    files += sorted((REPO_ROOT / "cluster_profiles").glob("*.yaml"))
    assert len(files) > 300
    differing = [
        str(path)
        for path in files
        if load_yaml(path) != OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    ]
    assert differing == []


def test_an_empty_file_is_an_empty_mapping(tmp_path: Path):
    (tmp_path / "empty.yaml").write_text("")
    assert load_yaml(tmp_path / "empty.yaml") == {}
