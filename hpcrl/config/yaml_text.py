"""YAML files as plain data, parsed exactly as OmegaConf parses them.

``OmegaConf.load`` parses with its own YAML loader and then builds a ``DictConfig`` the
loader throws away at once (``to_container``); the building is most of its cost (about 8x
the parse over NeMo RL's example configs). The loader is private API: found where omegaconf
2.4 (``_yaml``) and 2.3 (``_utils``) keep it, else ``OmegaConf.load`` itself.
``tests/config/test_yaml_text.py`` compares the two over NeMo RL's configs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig


def load_yaml(path: Path) -> Any:
    """The file's content as plain data (an empty file: {}); raises what parsing raises."""
    loader = _omegaconf_yaml_loader()
    if loader is None:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    import yaml

    with Path(path).open(encoding="utf-8") as stream:
        data = yaml.load(stream, Loader=loader)  # noqa: S506  (OmegaConf's own safe loader)
    return {} if data is None else data


def _omegaconf_yaml_loader() -> Any:
    # A private helper that moved between releases: looked up by name, so the type checker
    # (which reads the installed release) sees neither module's absence as an error.
    for module_name in ("omegaconf._yaml", "omegaconf._utils"):  # omegaconf 2.4, 2.3
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        get_yaml_loader = getattr(module, "get_yaml_loader", None)
        if get_yaml_loader is not None:
            return get_yaml_loader()
    return None


def dict_container(
    cfg: DictConfig, *, resolve: bool, throw_on_missing: bool = False
) -> dict[Any, Any]:
    """``OmegaConf.to_container`` of a ``DictConfig``: always a dict, typed as one."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=resolve, throw_on_missing=throw_on_missing)
    assert isinstance(container, dict), type(container)
    return container
