"""TEST STAND-IN for a container image's Python environment.

A real image (e.g. nvcr.io/nvidia/nemo-rl) brings its own Python with torch, Ray and
transformers, but not hpcrl, nor the submitit/cattrs/omegaconf versions hpcrl pins. Images
cannot be pulled or run here, so this builds the closest thing that really changes the
Python environment: a venv of the project's base interpreter whose site-packages reaches only
the heavy packages of this ``.venv`` and their dependencies (computed from their metadata),
through a ``.pth`` line naming a folder of symlinks to exactly those top-level entries. hpcrl,
submitit, cattrs and omegaconf are not there, so a job run with its ``bin/python3`` imports
them from the code bundle or fails.

The folder is laid out like a minimal root filesystem for the pyxis stand-in
(tests/slurm/pyxis_standin.c): ``etc/environment`` holds the variables the image defines
(``PATH`` with its ``bin`` first, and a ``PYTHONPATH`` of its own, as some images set one);
``--container-image=<folder>`` makes a task run with them.

An image may also carry other versions of the heavy packages than ``.venv`` has
(``own_requirements``): a NeMo RL image's Ray is 2.49.2, not 2.60. Those distributions are left
out of the links and pip installs them into the image's own site-packages (ahead of the .pth
folder) from the stand-in wheel cache (``.ci/standin-wheels``, listed in
tests/standin_wheels.txt), resolving their dependencies against the image: what the image's
packages satisfy is used from there, as an image's resolver would; anything else has to come
from the cache, or the build fails naming it. ``dependency_report`` shows, for each of their
requirements, the version the image has.

What it does not do: a real image also replaces /usr, /lib and every other path outside its
mounts, and may run another Python version. Here the host's files stay visible and the base
interpreter is the same CPython 3.11 (compiled packages must load), so the tests check the
environment boundary (which packages import, PATH, PYTHONPATH, the interpreter), not the
filesystem one. Nor does it carry the exact versions of Ray's dependencies (protobuf, grpcio,
...) that a real image locked when it was built: it has .venv's, checked against what the
image's Ray declares.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
#: The wheels .ci/standin-wheels downloads (one requirement a line) and where it keeps them.
STANDIN_WHEELS_FILE = REPO / "tests" / "standin_wheels.txt"
WHEEL_CACHE_VARIABLE = "HPCRL_STANDIN_WHEELS"

#: What an image for hpcrl brings (hpcrl.plan.requirements' every-job rows) + their deps.
IMAGE_ROOTS = ("torch", "ray[default]", "transformers", "tokenizers", "safetensors", "psutil")
#: Never in the image, whatever depends on them: the code bundle must bring these.
NOT_IN_IMAGE = frozenset({"hpcrl", "submitit", "cattrs", "omegaconf", "antlr4-python3-runtime"})
IMAGE_MARKER_MODULE = "standin_image_marker"


def _name(text: str) -> str:
    return text.lower().replace("_", "-").replace(".", "-")


def image_distributions(roots: tuple[str, ...], without: frozenset[str]) -> set[str]:
    """The installed distributions ``roots`` need (requirements, extras and markers followed),
    minus ``without`` and NOT_IN_IMAGE and everything only they pull in."""
    excluded = {_name(name) for name in without | NOT_IN_IMAGE}
    found: set[str] = set()
    pending = [Requirement(root) for root in roots]
    while pending:
        requirement = pending.pop()
        name = _name(requirement.name)
        if name in excluded or name in found:
            continue
        try:
            dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed here
        found.add(name)
        for text in dist.requires or ():
            child = Requirement(text)
            extras = requirement.extras or {""}
            if child.marker is None or any(
                child.marker.evaluate({"extra": extra}) for extra in extras
            ):
                pending.append(child)
    return found


def _top_level_entries(distribution: str) -> set[str]:
    dist = importlib.metadata.distribution(distribution)
    entries = set()
    for record in dist.files or ():
        first = record.parts[0]
        if first != ".." and not first.endswith(".pth") and first != "__pycache__":
            entries.add(first)
    return entries


def wheel_cache() -> Path:
    """Where .ci/standin-wheels keeps the stand-in wheels (the same default as the script)."""
    if os.environ.get(WHEEL_CACHE_VARIABLE):
        return Path(os.environ[WHEEL_CACHE_VARIABLE])
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "hpcrl" / "standin-wheels"


def standin_requirement(name: str) -> Requirement:
    """The line of tests/standin_wheels.txt that names ``name`` (e.g. ``ray==2.49.2``)."""
    for line in STANDIN_WHEELS_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == canonicalize_name(name):
                return requirement
    raise AssertionError(f"{STANDIN_WHEELS_FILE} lists no {name}")


def build_image(
    dest: Path, *, without: tuple[str, ...] = (), own_requirements: tuple[str, ...] = ()
) -> Path:
    """Create the stand-in image at ``dest`` (a fresh folder); returns ``dest``.

    ``without``: distributions the image lacks (and what only they need). ``own_requirements``:
    requirements such as ``ray[default]==2.49.2`` installed into the image itself from the wheel
    cache; the distributions they name are not linked from .venv, their dependencies are.
    """
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    site = (
        dest / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )
    heavy = dest / "heavy-packages"
    heavy.mkdir()
    source_site = Path(importlib.metadata.distribution("torch").locate_file(""))
    replaced = {_name(Requirement(text).name) for text in own_requirements}
    for distribution in sorted(image_distributions(IMAGE_ROOTS, frozenset(without)) - replaced):
        for entry in _top_level_entries(distribution):
            link = heavy / entry
            if not link.exists() and (source_site / entry).exists():
                link.symlink_to(source_site / entry)
    (site / "standin-image.pth").write_text(f"{heavy}\n")
    if own_requirements:
        _install_own(dest, own_requirements)
    own_path = dest / "image-pythonpath"
    own_path.mkdir()
    (own_path / f"{IMAGE_MARKER_MODULE}.py").write_text("IMAGE = True\n")
    (dest / "etc").mkdir()
    (dest / "etc" / "environment").write_text(
        f"PATH={dest / 'bin'}:/usr/local/bin:/usr/bin:/bin\nPYTHONPATH={own_path}\n"
    )
    return dest


def _install_own(image: Path, requirements: tuple[str, ...]) -> None:
    """pip, run for the image's python3: installs ``requirements`` into its site-packages from
    the wheel cache only, keeping every dependency the image (the .pth folder) satisfies.
    No byte-compiling: for Ray it takes 15 s of a test's time, and a job compiles only what
    it imports."""
    cache = wheel_cache()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(image / "bin" / "python3"), "install",
         "--disable-pip-version-check", "--no-index", "--find-links", str(cache), "--quiet",
         "--no-compile", "--no-warn-script-location", *requirements],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(
            f"the stand-in image cannot install {' '.join(requirements)} from {cache} (run "
            "`bash .ci/standin-wheels`; a dependency the image lacks must be listed in "
            f"{STANDIN_WHEELS_FILE.name} too):\n{result.stdout}{result.stderr}"
        )


def dependency_report(image: Path, distribution: str, extras: tuple[str, ...]) -> list[str]:
    """``distribution``'s declared requirements (with ``extras``) in the image, one line each:
    the requirement, the version the image has, and whether it satisfies it."""
    code = (
        "import importlib.metadata as m, json, sys; d = m.distribution(sys.argv[1]); "
        "print(json.dumps([d.version, d.requires or [], "
        "[(x.metadata['Name'], x.version) for x in m.distributions()]]))"
    )
    result = subprocess.run(
        [str(image / "bin" / "python3"), "-c", code, distribution], capture_output=True,
        text=True, check=True, timeout=60, cwd=image, env=image_environment(image, dict(os.environ)),
    )  # fmt: skip
    version, requires, found_on_path = json.loads(result.stdout)
    installed: dict[str, str] = {}
    for name, found_version in found_on_path:  # sys.path order: the first one imports
        installed.setdefault(_name(name), found_version)
    lines = [f"{distribution} {version}"]
    for text in requires:
        requirement = Requirement(text)
        environment = [{"extra": extra} for extra in ("", *extras)]
        if requirement.marker and not any(requirement.marker.evaluate(e) for e in environment):
            continue
        found = installed.get(_name(requirement.name))
        verdict = "MISSING" if found is None else (
            "ok" if requirement.specifier.contains(found, prereleases=True) else "CONFLICT"
        )  # fmt: skip
        lines.append(f"{verdict:<8} {requirement.name}{requirement.specifier} -> {found}")
    return lines


def image_environment(image: Path, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` as a task in ``image`` sees it (what the pyxis stand-in does): the host's
    Python variables dropped, the image's variables set."""
    task = {
        k: v for k, v in environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    for line in (image / "etc" / "environment").read_text().splitlines():
        name, _, value = line.partition("=")
        task[name] = value
    return task


def imports_in(image: Path, modules: tuple[str, ...], cwd: Path) -> dict[str, bool]:
    """Which of ``modules`` the image's python3 can import (run from ``cwd``)."""
    code = "import importlib.util, sys; print(*[int(importlib.util.find_spec(m) is not None) for m in sys.argv[1:]])"
    result = subprocess.run(
        [str(image / "bin" / "python3"), "-c", code, *modules],
        capture_output=True, text=True, check=True, timeout=60, cwd=cwd,
        env=image_environment(image, dict(os.environ)),
    )  # fmt: skip
    return dict(zip(modules, (flag == "1" for flag in result.stdout.split()), strict=True))
