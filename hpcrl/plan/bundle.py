"""What goes into a job's code bundle, and the hash that names it.

A container image brings the heavy, compiled packages (torch, Ray, transformers, Megatron,
vLLM); it does not bring hpcrl, nor the submitit, cattrs and omegaconf versions hpcrl pins.
The bundle does: hpcrl exactly as it runs here (its templates, recipes and profiles mapped
to ``hpcrl.templates`` etc. as in a wheel, so ``importlib.resources`` works from it) and the
pure-Python distributions the job side imports, copied file by file from this environment
(each distribution's RECORD; hpcrl from its package folders, also when installed editable).
Nothing is downloaded: compute nodes need no network and no pip.

The folder is named by a hash of every file's path and content, so each version of the code
is written once and every run of it reuses the folder (``hpcrl.render.bundle_writer``).
Compiled extension files are never copied: an image's Python may be another version. The one
package here that has one (PyYAML) falls back to pure Python without it.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

import hpcrl
from hpcrl.config.locate import shipped_package_dir
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.run.jobspec import BUNDLE_ENTRY

#: The job side's pure-Python dependencies: what hpcrl.job and hpcrl.core import (directly
#: or through hpcrl.config) beside the image's packages, plus what these require as installed
#: here (``required_distributions``): omegaconf 2.3 needs antlr4-python3-runtime, 2.4 vendors
#: it, so a fixed list failed on an environment without it. tests/render/test_bundle.py
#: imports the job side and checks that nothing else is needed.
BASE_PACKAGES = (
    "submitit",
    "cloudpickle",
    "typing_extensions",
    "attrs",
    "cattrs",
    "omegaconf",
    "PyYAML",
)
_REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
#: Packages mapped into hpcrl from folders at the repository root (setup.cfg package_dir).
RESOURCE_PACKAGES = ("hpcrl.templates", "hpcrl.recipes", "hpcrl.cluster_profiles")
#: Distributions whose compiled extension is optional: the extension is left out.
OPTIONAL_EXTENSIONS = frozenset({"pyyaml"})
BUNDLE_FORMAT = "hpcrl-bundle-1"
_COMPILED = re.compile(r"\.(so|pyd|dylib)(\.\d+)*$")  # extension modules, shared libraries
GIT_TIMEOUT_S = 2.0
OID_HEADER = "# branch.oid "  # git status --porcelain=v2 --branch: HEAD's commit


@attrs.frozen
class BundleContents(SharedMethods):
    """Everything a bundle holds, before it is written.

    ``files``: (path inside the bundle, absolute source file), sorted. ``generated``: (path,
    text) written as they are. ``packages``: (distribution, version) of each copied
    distribution. ``problems``: (requested name, why it cannot be bundled).
    """

    files: tuple[tuple[str, str], ...]
    generated: tuple[tuple[str, str], ...]
    digest: str
    packages: tuple[tuple[str, str], ...]
    extra_packages: tuple[str, ...]
    built_from: str
    problems: tuple[tuple[str, str], ...] = ()


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache  # per process: a sweep plans many points from the same files
def collect_bundle(extra_packages: tuple[str, ...] = ()) -> BundleContents:
    """The bundle of this environment: hpcrl, BASE_PACKAGES and ``extra_packages``."""
    files = _hpcrl_files()
    files.append((BUNDLE_ENTRY, str(Path(hpcrl.__file__).parent / "job" / "bundle_entry.py")))
    packages, problems = [], []
    base = required_distributions(BASE_PACKAGES)
    wanted = base + [name for name in extra_packages if normalized(name) not in _normalized(base)]
    for name in wanted:
        found = _distribution_files(name)
        if isinstance(found, str):
            problems.append((name, found))
            continue
        version, dist_files = found
        packages.append((name, version))
        files += dist_files
    generated = [(f"hpcrl-{hpcrl.__version__}.dist-info/METADATA", _hpcrl_metadata())]
    files.sort()
    return BundleContents(
        files=tuple(files),
        generated=tuple(generated),
        digest=_digest(files, generated),
        packages=tuple(sorted(packages, key=lambda item: normalized(item[0]))),
        extra_packages=tuple(extra_packages),
        built_from=sys.prefix,
        problems=tuple(problems),
    )


def _normalized(names: Iterable[str]) -> set[str]:
    return {normalized(name) for name in names}


def required_distributions(
    roots: Iterable[str],
    requires: Callable[[str], list[str] | None] | None = None,
    installed: Callable[[str], bool] | None = None,
) -> list[str]:
    """``roots`` and, transitively, the distributions they require as installed here, in
    first-seen order. Extras are skipped; a requirement under another marker (a Python
    version, a platform) counts only if it is installed, since pip installs it exactly when
    its marker holds. A root or unconditional requirement that is missing stays in the list:
    ``collect_bundle`` reports it."""
    import importlib.metadata  # only when a bundle is collected

    def _requires(name: str) -> list[str] | None:
        try:
            return importlib.metadata.requires(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    requires = requires or _requires
    installed = installed or _has_distribution
    order, seen, pending = [], set(), list(roots)
    while pending:
        name = pending.pop(0)
        if normalized(name) in seen:
            continue
        seen.add(normalized(name))
        order.append(name)
        for requirement in requires(name) or ():
            spec, _, marker = requirement.partition(";")
            found = _REQUIREMENT_NAME.match(spec)
            if found is None or "extra" in marker:
                continue
            if marker.strip() and not installed(found.group(1)):
                continue
            pending.append(found.group(1))
    return order


def _has_distribution(name: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _hpcrl_files() -> list[tuple[str, str]]:
    """hpcrl's own files, the mapped resource packages inside it as in a wheel (found as
    ``hpcrl.config.locate`` finds them: a bare checkout on ``sys.path`` has no mapping)."""
    package_dir = Path(hpcrl.__file__).parent
    files = _tree_files(package_dir, "hpcrl")
    for name in RESOURCE_PACKAGES:
        root = shipped_package_dir(name)
        if not root.is_relative_to(package_dir):  # editable install or bare checkout: repo root
            files += _tree_files(root, name.replace(".", "/"))
    return files


def _tree_files(root: Path, prefix: str) -> list[tuple[str, str]]:
    return [
        (f"{prefix}/{path.relative_to(root).as_posix()}", str(path))
        for path in root.rglob("*")
        if path.is_file() and _copied(path.relative_to(root).parts)
    ]


def _copied(parts: tuple[str, ...]) -> bool:
    """Source files only: no caches, hidden files or compiled extensions."""
    return not any(part == "__pycache__" or part.startswith(".") for part in parts) and not (
        parts[-1].endswith(".pyc") or _COMPILED.search(parts[-1])
    )


def _distribution_files(name: str) -> tuple[str, list[tuple[str, str]]] | str:
    """(version, files) of an installed distribution, or why it cannot be bundled."""
    import importlib.metadata  # ~20 ms: only when a bundle is collected

    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return f"not installed in {sys.prefix} (install it there, or remove it)"
    files, compiled = [], []
    for record in dist.files or ():
        parts = record.parts
        if parts[0] == ".." or record.name.endswith(".pth"):
            continue  # console scripts outside site-packages; path hooks
        if parts[0].endswith(".dist-info"):
            if record.name == "METADATA":
                files.append((record.as_posix(), str(dist.locate_file(record))))
            continue
        if _COMPILED.search(record.name):
            compiled.append(record.name)
        elif _copied(parts) and Path(str(dist.locate_file(record))).is_file():
            files.append((record.as_posix(), str(dist.locate_file(record))))
    if compiled and normalized(name) not in OPTIONAL_EXTENSIONS:
        return (
            f"has compiled extension modules ({', '.join(sorted(compiled)[:3])}); it must "
            "come from the job's Python (the container image)"
        )
    if not any(path.endswith(".py") for path, _ in files):
        return "has no Python files to copy here (installed editable?); install it normally"
    return dist.version, files


def _hpcrl_metadata() -> str:
    # So importlib.metadata reports the bundled hpcrl, not an installed one in the image.
    return f"Metadata-Version: 2.1\nName: hpcrl\nVersion: {hpcrl.__version__}\n"


def _digest(files: list[tuple[str, str]], generated: list[tuple[str, str]]) -> str:
    whole = hashlib.sha256(BUNDLE_FORMAT.encode() + b"\n")
    for path, source in files:
        whole.update(f"{path}\0{_file_sha256(source)}\n".encode())
    for path, text in generated:
        whole.update(f"{path}\0{hashlib.sha256(text.encode()).hexdigest()}\n".encode())
    return whole.hexdigest()[:16]


def _file_sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@functools.cache
def hpcrl_git_sha() -> str | None:
    """``<sha>``, or ``<sha>-dirty`` with uncommitted changes, when hpcrl runs from a git
    checkout (an editable install); None otherwise."""
    return checkout_git_sha(Path(hpcrl.__file__).parent)


def checkout_git_sha(package_dir: Path) -> str | None:
    """``hpcrl_git_sha`` of the package in ``package_dir``."""
    if "site-packages" in package_dir.parts:
        return None  # an installed wheel: a repository around the venv says nothing about it
    if not any((folder / ".git").exists() for folder in package_dir.parents):
        return None  # not in a checkout (pip --target): no git process to start and wait for
    # One git process for both (each costs a process start on the login node): the header
    # "# branch.oid <sha>" ("(initial)" before the first commit) and a line per change.
    status = _git(package_dir, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    if status is None:  # a git older than 2.11 (no porcelain v2): ask as before, twice
        return _git_sha_two_calls(package_dir)
    lines = status.splitlines()
    head = next((line[len(OID_HEADER) :] for line in lines if line.startswith(OID_HEADER)), "")
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        return None
    changed = any(not line.startswith("# ") for line in lines if line)
    return head + ("-dirty" if changed else "")


def _git_sha_two_calls(package_dir: Path) -> str | None:
    head = _git(package_dir, "rev-parse", "HEAD")
    if head is None or not re.fullmatch(r"[0-9a-f]{40}", head):
        return None
    changes = _git(package_dir, "status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changes else "")


def _git(directory: Path, *args: str) -> str | None:
    import subprocess  # here: a command that starts no process skips its import (~4 ms)

    try:
        result = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None
