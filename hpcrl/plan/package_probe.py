"""Which versions of some packages a Python environment has, read from the metadata folders on
its import path: nothing is imported, and neither is ``importlib.metadata`` (importing it alone
costs ~40 ms, a tenth of ``hpcrl validate``).

Used two ways by ``hpcrl.plan.job_python``: imported, when the job's Python is the interpreter
running hpcrl (its ``sys.path`` is the job's), and as a script by another interpreter (``python
-c <this file's text> ROWS``), which prints the same answer as JSON. Hence standard library
only, no hpcrl import, and the ``__main__`` block.

``rows``: ``[[distribution names], module]``. The answer per module: the version of the first
distribution name found (first path entry wins, as ``importlib.metadata``), ``""`` when no
metadata names it but the module can be found (version unknown), ``None`` when neither.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from importlib.machinery import PathFinder

_SEPARATORS = re.compile(r"[-_.]+")


def normalized(name: str) -> str:
    """A distribution name as metadata folders spell it (PEP 503, ``-`` as ``_``)."""
    return _SEPARATORS.sub("_", name).lower()


def installed_versions(entries: Iterable[str]) -> dict[str, str]:
    """{normalized distribution name: version} of every ``*.dist-info`` / ``*.egg-info`` found
    directly in the path entries; an earlier entry wins."""
    found: dict[str, str] = {}
    for entry in entries:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing folder
            continue
        for name in names:
            stem, _, suffix = name.rpartition(".")
            if suffix == "dist-info":
                # {name}-{version}: a version holds no '-' (PEP 440), a legacy name may
                distribution, _, version = stem.rpartition("-")
            elif suffix == "egg-info":
                distribution, version = _egg_info(os.path.join(entry or ".", name))
            else:
                continue
            if distribution and version:
                found.setdefault(normalized(distribution), version)
    return found


def _egg_info(path: str) -> tuple[str, str]:
    """(name, version) from an egg-info's PKG-INFO (its folder name may lack the version)."""
    pkg_info = os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path
    fields = {"name": "", "version": ""}
    try:
        with open(pkg_info, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                key, colon, value = line.partition(":")
                if not colon or not line.strip():
                    break  # the headers end at the first empty line
                if key.strip().lower() in fields:
                    fields[key.strip().lower()] = value.strip()
    except OSError:
        pass
    return fields["name"], fields["version"]


def module_found(module: str, entries: Sequence[str]) -> bool:
    """Whether ``module`` (dotted) can be found on ``entries``, without importing a parent
    package (``importlib.util.find_spec`` would import ``megatron`` to find ``megatron.core``)."""
    search: list[str] | None = list(entries)
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        if search is None:
            return False  # a plain module has no submodules
        spec = PathFinder.find_spec(".".join(parts[:depth]), search)
        if spec is None:
            return False
        locations = spec.submodule_search_locations
        search = list(locations) if locations is not None else None
    return True


def probe(rows: Sequence[Sequence], entries: Sequence[str]) -> dict[str, str | None]:
    """{module: version, "" (found, no metadata) or None (absent)} for ``rows``."""
    versions = installed_versions(entries)
    answer: dict[str, str | None] = {}
    for names, module in rows:
        version = next((versions[normalized(n)] for n in names if normalized(n) in versions), None)
        if version is None:
            version = "" if module_found(module, entries) else None
        answer[module] = version
    return answer


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]), sys.path)))
