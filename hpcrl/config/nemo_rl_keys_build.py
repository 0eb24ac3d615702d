"""Build the shipped NeMo RL key registry (``hpcrl/config/nemo_rl_releases/<release>.json``) from
a NeMo RL folder laid out as its repository: ``examples/configs`` and, when present, the
``nemo_rl`` source.

    python -m hpcrl.config.nemo_rl_keys_build ../shared/nemo-rl/main-7ea279a \\
        --release main-7ea279a [--source DIR]

Two parts, each saying where it came from:

- ``examples``: every key any example config sets (``defaults:`` merged, nothing resolved),
  how many configs set it, and the value each *base* config gives it (``BASE_CONFIGS``: the
  configs every other GRPO/SFT example starts from). Those values are NeMo RL's defaults as
  its users meet them. Rebuilt from the examples alone, so ``tests/config/test_nemo_rl_keys.py``
  checks this part against the snapshot the registry names.
- ``source``: every key NeMo RL's config classes define below the GRPO and SFT
  ``MasterConfig`` (``hpcrl.config.nemo_rl_source``), whether it is ``NotRequired`` (leaving
  it out is its default), whether it admits null, its pydantic default. Needs the source
  (``--source``, default: the folder itself when it holds ``nemo_rl/algorithms``); without it
  the part already shipped is kept as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcrl.config.nemo_rl_keys import REGISTRY_DIR, registry_file

#: The configs the other GRPO and SFT examples start from (``defaults:``): their values are
#: what NeMo RL's users get when they do not set a key. The Megatron variants carry the
#: megatron_cfg defaults, which the others leave disabled.
BASE_CONFIGS = (
    "grpo_math_1B.yaml",
    "grpo_math_1B_megatron.yaml",
    "sft.yaml",
    "sft_openmathinstruct2_megatron.yaml",
)
CONFIGS_DIR = Path("examples") / "configs"


def build(root: Path, release: str, commit: str, source: Path | None) -> dict[str, Any]:
    """The registry of ``release`` from the NeMo RL folder ``root``."""
    configs = root / CONFIGS_DIR
    if not configs.is_dir():
        raise SystemExit(f"{configs} is not a folder: give a folder laid out like NeMo RL's")
    registry: dict[str, Any] = {
        "release": release,
        "commit": commit,
        "examples": examples_part(root),
    }
    if source is not None:
        registry["source"] = source_part(source)
    else:
        registry["source"] = _shipped(release).get("source", {})
    return registry


def examples_part(root: Path) -> dict[str, Any]:
    """Keys of every example config with their base configs' values (see module doc)."""
    configs = root / CONFIGS_DIR
    paths = sorted(configs.rglob("*.yaml"))
    counts: dict[str, int] = {}
    cache: dict[Path, Any] = {}
    for path in paths:
        for key, _ in leaves(merged_raw(path, cache)):
            counts[key] = counts.get(key, 0) + 1
    defaults: dict[str, dict[str, Any]] = {}
    for name in BASE_CONFIGS:
        if (configs / name).is_file():
            for key, value in leaves(merged_raw(configs / name, cache)):
                defaults.setdefault(key, {})[name] = _jsonable(value)
    keys = {
        key: {"configs": count, **({"defaults": defaults[key]} if key in defaults else {})}
        for key, count in sorted(counts.items())
    }
    return {
        "configs": len(paths),
        "base_configs": [name for name in BASE_CONFIGS if (configs / name).is_file()],
        "keys": keys,
    }


def source_part(source: Path) -> dict[str, Any]:
    from hpcrl.config.nemo_rl_source import NO_DEFAULT, source_keys

    keys: dict[str, Any] = {}
    for key in source_keys(source):
        record: dict[str, Any] = {"defined_in": key.defined_in}
        if key.not_required:
            record["not_required"] = True
        if key.nullable:
            record["nullable"] = True
        if key.free_form:
            record["free_form"] = True
        if key.default is not NO_DEFAULT and _is_json(key.default):
            record["default"] = _jsonable(key.default)
        keys[key.path] = record
    return {
        "roots": [
            "nemo_rl/algorithms/grpo.py:MasterConfig",
            "nemo_rl/algorithms/sft.py:MasterConfig",
        ],
        "keys": keys,
    }


def merged_raw(path: Path, cache: dict[Path, Any] | None = None) -> dict[str, Any]:
    """A config with its ``defaults:`` merged as NeMo RL merges them, nothing resolved
    (``cache``: files already read in this build, by path)."""
    from hpcrl.config.deep_merge import deep_merge

    cache = {} if cache is None else cache
    if path not in cache:
        cache[path] = read_yaml(path)
    data = dict(cache[path])
    bases = data.pop("defaults", None) or []
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        if (path.parent / base).is_file():  # some name files outside examples/configs
            merged = deep_merge(
                merged, merged_raw(Path(os.path.normpath(path.parent / base)), cache)
            )
    return deep_merge(merged, data)


def read_yaml(path: Path) -> dict[str, Any]:
    from hpcrl.config.yaml_text import load_yaml

    data = load_yaml(path)
    assert isinstance(data, dict), f"{path} does not hold keys at the top level"
    return data


def leaves(value: Any, parts: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf; an empty mapping or a list is a leaf."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, parts + (str(key),))
    elif parts:
        yield ".".join(parts), value


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted(_jsonable(item) for item in value)
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _is_json(value: Any) -> bool:
    try:
        json.dumps(_jsonable(value))
    except (TypeError, ValueError):
        return False
    return True


def _shipped(release: str) -> dict[str, Any]:
    path = registry_file(release)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def dumps(registry: dict[str, Any]) -> str:
    return json.dumps(registry, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="NeMo RL folder (examples/configs inside)")
    parser.add_argument("--release", required=True, help="e.g. v0.7.0, main-7ea279a")
    parser.add_argument("--commit", default="", help="the NeMo RL commit the folder holds")
    parser.add_argument("--source", type=Path, help="NeMo RL source checkout (nemo_rl/ inside)")
    args = parser.parse_args(argv)
    source = args.source
    if source is None and (args.folder / "nemo_rl" / "algorithms").is_dir():
        source = args.folder
    commit = args.commit or _shipped(args.release).get("commit", "")
    registry = build(args.folder, args.release, commit, source)
    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    path = registry_file(args.release)
    path.write_text(dumps(registry), encoding="utf-8")
    print(
        f"wrote {path}: {len(registry['examples']['keys'])} example keys, "
        f"{len(registry['source'].get('keys', {}))} source keys"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
