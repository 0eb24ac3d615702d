"""NeMo RL's own example configs and config loader, read from the snapshots in
``../shared/nemo-rl/<release>/`` (laid out as in NeMo RL's repository; CI has them beside the
checkout). Nothing is copied into the project: a test that needs a snapshot that is missing
skips locally and fails under CI (``tests.require``).

``HPCRL_NEMO_RL_SNAPSHOTS`` names another folder holding the releases; otherwise the first
``shared/nemo-rl`` beside the checkout or beside a folder above it (a git worktree under
``/work/wt/<name>`` finds ``/work/shared``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from hpcrl.config import LoadedRecipe, load_recipe
from tests.require import unavailable

REPO_ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS_ENV = "HPCRL_NEMO_RL_SNAPSHOTS"
MAIN = "main-7ea279a"
#: The NeMo RL releases hpcrl supports (hpcrl/config/nemo_rl_releases/<release>.json).
RELEASES = ("v0.5.0", "v0.7.0", MAIN)


def snapshots_root() -> Path:
    named = os.environ.get(SNAPSHOTS_ENV)
    if named:
        return Path(named)
    for folder in REPO_ROOT.parents:
        candidate = folder / "shared" / "nemo-rl"
        if candidate.is_dir():
            return candidate
    return REPO_ROOT.parent / "shared" / "nemo-rl"


def release_root(release: str = MAIN) -> Path:
    root = snapshots_root() / release
    if not (root / "examples" / "configs").is_dir():
        unavailable(
            "deps",
            f"NeMo RL's {release} snapshot is not at {root} (CI has ../shared/nemo-rl beside "
            f"the checkout; set {SNAPSHOTS_ENV} to the folder holding the releases)",
        )
    return root


def config_path(relative: str, release: str = MAIN) -> Path:
    """``examples/configs/<relative>`` of a release, e.g. ``grpo_math_1B.yaml``."""
    path = release_root(release) / "examples" / "configs" / relative
    assert path.is_file(), f"{path} is not in the {release} snapshot"
    return path


def nemo_rl_config_module(release: str = MAIN) -> ModuleType:
    """NeMo RL's ``nemo_rl/utils/config.py`` of the snapshot, imported from there (it needs
    omegaconf and hydra-core, both in the test environment)."""
    path = release_root(release) / "nemo_rl" / "utils" / "config.py"
    name = f"nemo_rl_config_{release.replace('.', '_').replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nemo_rl_resolved(path: Path, release: str = MAIN) -> dict[str, Any]:
    """The config as NeMo RL's run scripts see it: load_config (``defaults:`` inheritance),
    its resolvers registered, every interpolation resolved to a plain dict."""
    from omegaconf import OmegaConf

    module = nemo_rl_config_module(release)
    config = module.load_config(path)
    with _nemo_rl_resolvers(module):
        resolved = OmegaConf.to_container(config, resolve=True)
    assert isinstance(resolved, dict)
    return resolved


@contextlib.contextmanager
def _nemo_rl_resolvers(module: ModuleType) -> Iterator[None]:
    """NeMo RL's own resolvers while resolving, not hpcrl's: OmegaConf keeps one registry
    per process and both register by the same names, each only when the name is free
    (hpcrl's loader registers its own again on its next load)."""
    from omegaconf import OmegaConf

    names = ("add", "sub", "mul", "div", "max")
    for name in names:
        OmegaConf.clear_resolver(name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # OmegaConf 2.4 renamed the call
            if hasattr(module, "register_omegaconf_resolvers"):
                module.register_omegaconf_resolvers()
            else:  # v0.5.0: examples/run_grpo.py and run_sft.py register them at import
                OmegaConf.register_new_resolver("mul", lambda a, b: a * b)
                OmegaConf.register_new_resolver("max", lambda a, b: max(a, b))
        yield
    finally:
        for name in names:
            OmegaConf.clear_resolver(name)


def load_as_hpcrl(path: Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedRecipe:
    """hpcrl's load_recipe of a NeMo RL file, unmodified: keys hpcrl's schema does not hold
    are judged by the NeMo RL key registry (hpcrl.config.nemo_rl_keys), as for a user."""
    return load_recipe(path, list(overrides))


def nemo_rl_config(release: str, relative: str) -> dict[str, Any]:
    """The dict of ``examples/configs/<relative>`` of a release as hpcrl's loader reads it:
    ``defaults:`` merged, interpolation resolved, nothing validated."""
    from hpcrl.config.merged_yaml import load_merged
    from hpcrl.config.recipe import Recipe

    merged = load_merged(config_path(relative, release), (), Recipe)
    assert merged.resolved is not None, [str(p) for p in merged.problems]
    return merged.resolved
