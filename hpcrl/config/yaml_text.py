"""YAML files as plain data, parsed exactly as OmegaConf parses them, without OmegaConf.

``OmegaConf.load`` parses with its own YAML loader and then builds a ``DictConfig`` the
loader throws away at once (``to_container``); the building is most of its cost (about 8x
the parse over NeMo RL's example configs), and importing omegaconf costs ~40 ms more. hpcrl
parses with a loader of its own that reads as OmegaConf's does (``hpcrl.config.yaml_loader``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.config.yaml_loader import load_yaml_text

if TYPE_CHECKING:
    from omegaconf import DictConfig


def load_yaml(path: Path) -> Any:
    """The file's content as plain data (an empty file: {}); raises what parsing raises."""
    with Path(path).open(encoding="utf-8") as stream:
        data = load_yaml_text(stream)
    return {} if data is None else data


def dict_container(
    cfg: DictConfig, *, resolve: bool, throw_on_missing: bool = False
) -> dict[Any, Any]:
    """``OmegaConf.to_container`` of a ``DictConfig``: always a dict, typed as one."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=resolve, throw_on_missing=throw_on_missing)
    assert isinstance(container, dict), type(container)
    return container
