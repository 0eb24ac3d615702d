"""YAML files as plain data, parsed exactly as OmegaConf parses them.

``OmegaConf.load`` parses with its own YAML loader and then builds a ``DictConfig`` the
loader throws away at once (``to_container``); the building is most of its cost (about 8x
the parse over NeMo RL's example configs). The loader is private API: found where omegaconf
2.4 (``_yaml``) and 2.3 (``_utils``) keep it, else ``OmegaConf.load`` itself.
``tests/config/test_yaml_text.py`` compares the two over NeMo RL's configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
    try:
        from omegaconf._yaml import get_yaml_loader  # omegaconf 2.4
    except ImportError:
        try:
            from omegaconf._utils import get_yaml_loader  # omegaconf 2.3
        except ImportError:
            return None
    return get_yaml_loader()
