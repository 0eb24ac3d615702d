"""The NeMo RL key registry: every key NeMo RL knows in the releases hpcrl supports, with the
defaults NeMo RL gives it, read from the data shipped in
``hpcrl/config/nemo_rl_releases/<release>.json`` (built by ``hpcrl.config.nemo_rl_keys_build``
from NeMo RL's example configs and config classes; ``tests/config/test_nemo_rl_keys.py``
fails when a file is stale against the NeMo RL snapshot it names).

The registry supplies knowledge (does NeMo RL know this key, what is its default);
``hpcrl.config.foreign_keys`` supplies hpcrl's own decisions per key, and wins. Loaded only
when a recipe holds a key hpcrl's schema does not (``registry()`` is cached per process).

Where a default comes from is kept with it (``Default.source``):

- ``examples/configs/<base>.yaml``: the value one of NeMo RL's base configs gives it
  (``nemo_rl_keys_build.BASE_CONFIGS``: what every other GRPO/SFT example starts from);
- ``<module>:<Class> (pydantic default)``: the default NeMo RL's config class declares;
- ``NotRequired`` / nullable keys: null means "not set" (``KnownKey.null_is_off``).

A value is at its default when it equals one of the key's defaults in any supported release
(numbers compare by value, booleans only to booleans), or when it is written exactly as the
default is (``${.temperature}`` stays a default whatever temperature resolves to).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.shared_methods import SharedMethods

#: NeMo RL releases whose configs hpcrl reads (docs/nemo-rl-compat.md, README).
SUPPORTED_RELEASES = ("v0.5.0", "v0.7.0", "main-7ea279a")
REGISTRY_DIR = Path(__file__).resolve().parent / "nemo_rl_releases"


def registry_file(release: str) -> Path:
    return REGISTRY_DIR / f"{release}.json"


@attrs.frozen
class Default(SharedMethods):
    """One default of a key and where it comes from (a base config or a config class)."""

    value: Any
    source: str

    def describe(self) -> str:
        return f"{_yaml(self.value)} ({self.source})"


@attrs.frozen
class KnownKey(SharedMethods):
    """What the supported releases say about one dotted key path (NeMo RL's spelling)."""

    path: str
    releases: tuple[str, ...]
    defaults: tuple[Default, ...] = ()
    null_is_off: bool = False  # NotRequired or nullable in a config class: null = not set
    free_form: bool = False  # a mapping of the user's own keys (dict[str, ...])
    section: bool = False  # keys below it exist

    def default_for(self, value: Any, written: Any = None) -> Default | None:
        """The default ``value`` (as resolved; ``written``: as written) equals, or None."""
        for default in self.defaults:
            if same_value(value, default.value):
                return default
            if isinstance(written, str) and "${" in written and written == default.value:
                return default
        return None

    def defaults_text(self) -> str:
        shown: list[str] = []
        for default in self.defaults:
            text = _yaml(default.value)
            if text not in shown:
                shown.append(text)
        return " or ".join(shown)


class Registry:
    """Lookups over every supported release's key data (one instance per process)."""

    def __init__(self, releases: Mapping[str, Mapping[str, Any]]):
        self._keys: dict[str, KnownKey] = {}
        self._base: set[str] = set()
        for release, data in releases.items():
            examples = data.get("examples", {}).get("keys", {})
            self._base |= {path for path, key in examples.items() if "defaults" in key}
            for path, key in _release_keys(release, data):
                self._keys[path] = _merge(self._keys.get(path), key)
        self._children: dict[str, set[str]] = {}
        for path in list(self._keys):
            parent, _, name = path.rpartition(".")
            while parent:
                self._children.setdefault(parent, set()).add(name)
                if parent not in self._keys:  # a section the examples set only keys below
                    self._keys[parent] = KnownKey(path=parent, releases=self._keys[path].releases)
                parent, _, name = parent.rpartition(".")
            self._children.setdefault("", set()).add(name)
        self._keys = {
            path: attrs.evolve(key, section=path in self._children)
            for path, key in self._keys.items()
        }

    def lookup(self, parts: Iterable[str]) -> KnownKey | None:
        """The key, or the free-form mapping above it (whose keys are all the user's)."""
        names = tuple(parts)
        found = self._keys.get(".".join(names))
        if found is not None:
            return found
        for depth in range(len(names) - 1, 0, -1):
            above = self._keys.get(".".join(names[:depth]))
            if above is not None and above.free_form:
                return above
        return None

    def children(self, parts: Iterable[str]) -> list[str]:
        return sorted(self._children.get(".".join(parts), ()))

    def base_config_keys(self) -> list[str]:
        """Keys some base config sets (``nemo_rl_keys_build.BASE_CONFIGS``), any release."""
        return sorted(self._base)

    def __len__(self) -> int:
        return len(self._keys)


@functools.cache
def registry() -> Registry:
    """Every supported release's registry, read once per process (on first need only)."""
    releases = {
        release: json.loads(registry_file(release).read_text(encoding="utf-8"))
        for release in SUPPORTED_RELEASES
    }
    return Registry(releases)


def _release_keys(release: str, data: Mapping[str, Any]) -> Iterable[tuple[str, KnownKey]]:
    examples = data.get("examples", {}).get("keys", {})
    source = data.get("source", {}).get("keys", {})
    for path in sorted(set(examples) | set(source)):
        from_examples, from_source = examples.get(path, {}), source.get(path, {})
        defaults = [
            Default(value=value, source=f"examples/configs/{config} in NeMo RL {release}")
            for config, value in sorted(from_examples.get("defaults", {}).items())
        ]
        if "default" in from_source:
            defaults.append(
                Default(
                    value=from_source["default"],
                    source=f"{from_source['defined_in']} in NeMo RL {release}",
                )
            )
        yield (
            path,
            KnownKey(
                path=path,
                releases=(release,),
                defaults=tuple(defaults),
                null_is_off=bool(from_source.get("not_required") or from_source.get("nullable")),
                free_form=bool(from_source.get("free_form")),
            ),
        )


def _merge(old: KnownKey | None, new: KnownKey) -> KnownKey:
    if old is None:
        return new
    return attrs.evolve(
        old,
        releases=old.releases + new.releases,
        defaults=old.defaults + new.defaults,
        null_is_off=old.null_is_off or new.null_is_off,
        free_form=old.free_form or new.free_form,
    )


def same_value(a: Any, b: Any) -> bool:
    """YAML values equal as NeMo RL reads them: 1 == 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(same_value(a[key], b[key]) for key in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value) if isinstance(value, list | dict) else str(value)
